"""Serving a decoder over HTTP in OpenAI's API (`zoo-serve`): one engine that owns the model and decodes every
request's sequences together, continuously batched (`engine`), and the FastAPI app whose handlers only parse,
queue and stream (`app`). FastAPI and uvicorn are the `serve` extra: pip install -e '.[serve]'."""
