"""kvtrace.store"""
