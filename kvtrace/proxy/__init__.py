"""kvtrace.proxy"""
