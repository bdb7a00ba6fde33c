"""What every layer shares: the error vocabulary (errors), device names (devices), atomic publishing (publish) and
progress bars; imports nothing from the project's other packages."""
