"""Spiders of the forum application."""
