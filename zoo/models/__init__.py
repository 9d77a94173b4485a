"""Model families: one file each (config presets -> modules -> heads). PRESETS: every named preset."""

from zoo.models import bert, encdec, gpt

PRESETS = {**gpt.PRESETS, **bert.PRESETS, **encdec.PRESETS}
