"""Consumers: pull (caller-driven), push (rebalanced, listener-driven), and their building blocks."""
