"""One completion of zoo-serve's (zoo.serve.app): the ids the engine hands out, decoded incrementally, cut at a stop
string, and the text a stream may send so far."""

from __future__ import annotations

import asyncio


class Choice:
    """One completion: the ids the engine hands out, the text so far (cut at a stop string) and how it ended."""

    def __init__(self, tokenizer, stops: list[str], loop, queue: asyncio.Queue):
        self.tok, self.stops, self.loop, self.queue = tokenizer, stops, loop, queue
        self.ids: list[int] = []
        self.text, self.sent, self.finish, self.gone = "", 0, None, False
        self._done, self._prefix, self._read = "", 0, 0  # the final text of ids[:_read]; ids[_prefix:_read] its tail

    def decoded(self) -> str:
        """The text of self.ids, decoding only the newest ids beside the few before them (the incremental
        detokenizer of vLLM and transformers' TextStreamer: ids[_prefix:_read] are context, whose own text is cut
        off the front), so a completion of n tokens costs O(n) decoding, not O(n^2). A half-decoded character
        (a trailing U+FFFD) stays pending until its next token comes."""
        base = self.tok.decode(self.ids[self._prefix:self._read])
        full = self.tok.decode(self.ids[self._prefix:])
        if not full.startswith(base):  # a tokenizer whose text of a tail is no suffix of the whole: decode it all
            return self.tok.decode(self.ids)
        if full.endswith("\ufffd"):
            return self._done + full[len(base):]
        self._done += full[len(base):]
        self._prefix, self._read = self._read, len(self.ids)
        return self._done

    def emit(self, ids: list[int], finish: str | None) -> bool:
        """Engine thread: new ids (and the finish reason at the end); True when a stop string ended it early. Puts
        (this choice, the text it adds, its finish reason) on the request's queue."""
        self.ids += ids
        text = self.decoded()
        ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if finish is not None or ends:  # the answer's text is the whole decode, whatever the increments gave
            text = self.tok.decode(self.ids)
            ends = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        stopped = bool(ends)
        if stopped:
            text, finish = text[:min(ends)], "stop"
        self.text = text
        if finish is not None:
            self.finish = finish
        # the text this emit adds, cut here: a stream sends each emit's piece as an event of its own (token by
        # token), however late the event loop takes them
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (self, self.pending(), self.finish))
        return stopped

    def pending(self) -> str:
        """The text not sent yet, less what could still become a stop string or a half-decoded character."""
        end = len(self.text)
        if self.finish is None:
            hold = max((len(s) - 1 for s in self.stops), default=0)
            end = max(self.sent, len(self.text.rstrip("\ufffd")) - hold)
        piece, self.sent = self.text[self.sent:end], max(self.sent, end)
        return piece
