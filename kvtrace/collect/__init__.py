"""kvtrace.collect"""
