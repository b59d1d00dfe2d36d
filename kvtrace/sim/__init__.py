"""kvtrace.sim"""
