"""Model families: one file each (config presets -> modules -> heads). PRESETS: every named preset."""

from zoo.models import gpt

PRESETS = {**gpt.PRESETS}
