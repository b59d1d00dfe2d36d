"""kvtrace.vllm"""
