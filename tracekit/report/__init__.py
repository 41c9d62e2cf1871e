"""Reports people read: the self-contained HTML page of a diff or validation."""
