"""Model families: one file each (config presets -> modules -> heads)."""
