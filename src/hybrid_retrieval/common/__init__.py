"""Helpers shared by every layer; imports nothing from the project's other packages."""
