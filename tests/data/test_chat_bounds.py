"""A chat template is code from a checkpoint: whatever it does, rendering ends soon, in one ZooDataError
line, with its output bounded (issue "trust, round two", item 4). The sandbox's own escapes stay closed."""

import time

import pytest

from zoo.data import chat
from zoo.errors import ZooDataError

HI = [{"role": "user", "content": "hi"}]


def render(text):
    return chat.render(chat.ChatTemplate(text, "t.jinja"), HI, add_generation_prompt=True, variables={})


@pytest.mark.parametrize("template, fragment", [
    ("{% include 'x' %}", "{% include %}, {% extends %} and {% import %} are not available"),
    ("{% extends 'x' %}", "{% include %}, {% extends %} and {% import %} are not available"),
    ("{% import 'x' as y %}", "{% include %}, {% extends %} and {% import %} are not available"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    ("{{ 'a' * 100000000 }}", "SecurityError: a product of more than 10,000,000 items"),
    ("{{ [1] * 100000000 }}", "SecurityError: a product of more than 10,000,000 items"),
    ("{{ 2 ** 100000 }}", "SecurityError: a power of 100000"),
    ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "writes more than 10,000,000 characters"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "RenderTimeout: rendering took more than 0.5 s"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),  # the sandbox, as before
])
def test_a_hostile_template_ends_in_one_line_soon(monkeypatch, template, fragment):
    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.5)
    t0 = time.perf_counter()
    with pytest.raises(ZooDataError) as e:
        render(template)
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert msg.startswith("the chat template (t.jinja) ") and fragment in msg and "\n" not in msg


def test_an_ordinary_template_renders_as_before_and_leaves_no_timer():
    import signal
    before = signal.getsignal(signal.SIGALRM)
    assert render("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] * 3 }}{% endfor %}") == "<user>hihihi"
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
