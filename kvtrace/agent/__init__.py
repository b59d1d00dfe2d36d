"""kvtrace.agent"""
