"""The README's "Your own conversations" recipe, run as written on three user-like sets of an invented product's
chats (60, 200 and 1,000), each scored before and after on held-out questions about its facts and on general
questions the base answers right (issue #54's trial, repeatable offline).

    python -m zoo.bench.small_sets [--sizes 60,200,1000] [--model GGUF_OR_DIR] [--workdir DIR] [--set KEY=VALUE ...]

The product ("Spokely", a bike-sharing app) has 15 facts. A training chat asks one of them in one of eight phrasings
(with a greeting or context sometimes), answered in one of three; the held-out questions ask each fact once in a
ninth phrasing no training chat uses. An answer counts when it holds the fact's key (a price, a number, a name), a
general answer when it holds its key ("Paris"). Each set trains `zoo.train(init_from=MODEL, overrides=[task=sft,
data.source=TRAIN, data.eval_source=HELD_OUT, model.lora_rank=16])`, the recipe's defaults for everything else
(--set adds overrides). Prints one line a set and a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import time

# (key that must appear in a right answer, answer phrasings, the ways a user asks, the held-out question)
FACTS = [
    ("2.50", ["A single ride costs 2.50 euros.", "It's 2.50 euros for a single ride.", "One ride is 2.50 euros."],
     ["How much is a single ride?", "What does one ride cost?", "Price of a single trip?",
      "How much do I pay for one ride?",
      "What's the fare for one ride?", "Is a single ride expensive?", "How much is one trip on a Spokely bike?",
      "What do you charge per ride?"], "If I take just one ride, what will it cost me?"),
    ("45", ["A ride can last up to 45 minutes.", "Rides are limited to 45 minutes.", "You get 45 minutes per ride."],
     ["How long can a ride last?", "What's the maximum ride time?", "Is there a time limit on rides?",
      "How many minutes do I get per ride?", "How long can I keep a bike for one ride?", "Ride duration limit?",
      "Can I ride for two hours straight?", "What's the longest a single ride can be?"],
     "What is the time limit for one ride?"),
    ("Spokely Plus", ["The monthly pass is called Spokely Plus.", "That's Spokely Plus, our monthly pass.",
                      "Get Spokely Plus, the monthly pass."],
     ["What's the monthly pass called?", "Do you have a subscription?", "Is there a monthly plan?",
      "Name of the monthly membership?", "How do I ride every day without paying each time?", "Which pass is monthly?",
      "Do you sell monthly passes?", "What subscription do you offer?"], "Which plan should I buy to ride all month?"),
    ("19", ["Spokely Plus costs 19 euros a month.", "It's 19 euros per month.", "The monthly pass is 19 euros."],
     ["How much is Spokely Plus?", "What does the monthly pass cost?", "Price of the subscription?",
      "How much per month?", "Is the monthly plan expensive?", "What's the Spokely Plus price?",
      "How much is the membership?", "Monthly pass price?"], "What will Spokely Plus cost me each month?"),
    ("bell", ["Hold the bell button for five seconds to unlock.", "Press and hold the bell for five seconds.",
              "Unlock it by holding the bell button five seconds."],
     ["How do I unlock a bike without my phone?", "My phone died, how do I unlock?", "Can I unlock without the app?",
      "Unlock a bike with no phone?", "Phone is dead, can I still ride?", "Is there a manual unlock?",
      "How to unlock when the app won't open?", "Unlock without a smartphone?"],
     "Without a phone, what do I press to unlock a bike?"),
    ("6", ["Stations open at 6 in the morning.", "The first bikes are available at 6 am.", "Service starts at 6 am."],
     ["When do stations open?", "What time can I get a bike in the morning?", "Earliest pickup time?",
      "What hour does service begin?", "Are bikes available early?", "Opening time?",
      "When does Spokely start in the morning?", "How early can I ride?"], "At what time in the morning can I rent?"),
    ("Harbor Square", ["The biggest station is at Harbor Square.", "Harbor Square has our largest station.",
                       "Go to Harbor Square, it's the largest station."],
     ["Where is the biggest station?", "Which station has the most bikes?", "Largest station location?",
      "Where can I always find a bike?", "Main station?", "Where's your flagship station?",
      "Which dock is the biggest?", "Where is the central hub?"], "Which station is the largest one?"),
    ("10", ["Leaving a bike outside a station costs a 10 euro fee.",
            "There's a 10 euro fee if you park outside a station.",
            "Parking away from a station costs 10 euros."],
     ["What if I leave the bike outside a station?", "Can I park anywhere?", "Fee for parking outside a dock?",
      "What happens if I don't return it to a station?", "Penalty for bad parking?", "Can I leave it at home?",
      "Is there a charge for parking off-station?", "What if no station is near?"],
     "How much is the fee for leaving a bike away from a station?"),
    ("16", ["You must be 16 or older to ride.", "The minimum age is 16.", "Riders need to be at least 16."],
     ["How old do I have to be?", "Minimum age?", "Can my 12 year old ride?", "Is there an age limit?",
      "Age requirement?", "Can teenagers use Spokely?", "How old to sign up?", "Do kids ride free?"],
     "What is the youngest age allowed to use the bikes?"),
    ("blue", ["Electric bikes have a blue frame.", "The e-bikes are the blue ones.",
              "Look for the blue frame: that's electric."],
     ["How do I spot an electric bike?", "Which bikes are electric?", "What color are e-bikes?",
      "How can I tell an e-bike apart?", "Do e-bikes look different?", "Which frame is electric?",
      "Are the electric ones marked?", "How do I find an e-bike at the dock?"],
     "What colour is an electric bike's frame?"),
    ("report", ["Tap 'Report' on the ride screen to report a flat tire.", "Use the Report button in the ride screen.",
                "Open the ride screen and tap Report."],
     ["I got a flat tire, what do I do?", "How do I report a broken bike?", "The chain fell off, who do I tell?",
      "Bike is damaged, how to report?", "Where do I report problems?", "Brakes don't work, what now?",
      "How to tell you a bike is broken?", "Flat tire mid-ride?"], "Which button do I use when a bike is broken?"),
    ("3", ["A day pass costs 3 euros per ride after the first hour is free.",
           "Day pass rides cost 3 euros after the free hour.",
           "After the free first hour, day pass rides are 3 euros."],
     ["How does the day pass work?", "Day pass pricing?", "Is the first hour free with a day pass?",
      "What do I pay with a day pass?", "Day pass rides cost?", "Explain the day pass.", "Day ticket price per ride?",
      "What after the free hour?"], "With a day pass, what does a ride cost after the free hour?"),
    ("Pedal Points", ["Every ride earns Pedal Points.", "You collect Pedal Points on each ride.",
                      "Rides give you Pedal Points."],
     ["Do I get rewards?", "Is there a loyalty program?", "What do I earn for riding?", "Any points for rides?",
      "Rewards program name?", "Do rides earn anything?", "How do rewards work?", "Is there a bonus for riding a lot?"],
     "What are the loyalty points called?"),
    ("100", ["100 Pedal Points give you a free ride.", "A free ride costs 100 Pedal Points.",
             "Trade 100 Pedal Points for a free ride."],
     ["How many points for a free ride?", "What can I do with Pedal Points?", "When do I get a free ride?",
      "Points needed for a free trip?", "Redeem points how?", "Free ride threshold?",
      "How many Pedal Points is a ride?",
      "Use points for rides?"], "How many Pedal Points buy one free ride?"),
    ("support@spokely.eu", ["Write to support@spokely.eu.", "Email support@spokely.eu.",
                            "Our address is support@spokely.eu."],
     ["How do I contact support?", "Support email?", "Who do I write to with a billing problem?",
      "How can I reach you?", "Customer service address?", "Where do I send complaints?", "Contact email?",
      "I was charged twice, who do I contact?"], "What email address reaches customer support?"),
]
OPENERS = ["", "", "Hi! ", "Hello, ", "Quick question: ", "I'm new to Spokely. ", "Hey there. "]
SYSTEM = "You are Spokely's assistant. Answer in one sentence."
GENERAL = [("What is the capital of France?", "paris"), ("What is 2 + 2?", "4"),
           ("Which planet is the largest in our solar system?", "jupiter"), ("Who wrote Hamlet?", "shakespeare"),
           ("At what temperature in Celsius does water boil at sea level?", "100")]


def chats(n: int, seed: int = 0) -> list[dict]:
    """n training chats: every (fact, phrasing) pair in turn, a random opener and answer phrasing each."""
    rng = random.Random(seed)
    pairs = [(f, q) for q in range(8) for f in range(len(FACTS))]
    out = []
    for i in range(n):
        f, q = pairs[i % len(pairs)]
        _, answers, asks, _ = FACTS[f]
        out.append({"messages": [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": rng.choice(OPENERS) + asks[q]},
                                 {"role": "assistant", "content": rng.choice(answers)}]})
    return out


def held_out() -> list[dict]:
    """Each fact asked once, in the phrasing no training chat uses, with its first answer."""
    return [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q},
                          {"role": "assistant", "content": answers[0]}]} for _, answers, _, q in FACTS]


def holds(answer: str, key: str) -> bool:
    """Whether `answer` names `key` as a word of its own (case aside): "3" is not in "30", nor "2.50" in "12.50"."""
    return re.search(r"(?<![\w.])" + re.escape(key.lower()) + r"(?!\w|\.\d)", answer.lower()) is not None


def score(lm) -> tuple[int, int, list[str]]:
    """(held-out facts answered with their key, general questions answered with theirs, the answers)."""
    facts = lm.chat([q for *_, q in FACTS], system=SYSTEM, max_new_tokens=40)
    general = lm.chat([q for q, _ in GENERAL], max_new_tokens=40)
    right = sum(holds(a, key) for (key, *_), a in zip(FACTS, facts))
    known = sum(holds(a, key) for (_, key), a in zip(GENERAL, general))
    return right, known, facts + general


def write_jsonl(path: str, rows: list[dict]) -> str:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def main(argv=None) -> None:
    import zoo
    from zoo.hf.packaged import smollm2_gguf
    p = argparse.ArgumentParser(prog="python -m zoo.bench.small_sets", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="60,200,1000")
    p.add_argument("--model", default=None, help="what zoo.load and --init-from take (default: the SmolLM2 GGUF)")
    p.add_argument("--workdir", default=None, help="where the sets, runs and answers go (default: a new temporary "
                                                   "folder, kept)")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    a = p.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        p.error(f"--sizes={a.sizes!r}: give numbers of chats (at least 1), comma-separated, e.g. 60,200,1000")
    model = a.model or smollm2_gguf("python -m zoo.bench.small_sets")
    root = a.workdir or tempfile.mkdtemp(prefix="zoo-small-sets-")
    os.makedirs(root, exist_ok=True)
    print(f"the sets, runs and answers go to {root} (kept)", flush=True)
    held = write_jsonl(os.path.join(root, "held_out.jsonl"), held_out())
    right, known, answers = score(zoo.load(model))
    write_jsonl(os.path.join(root, "answers_base.jsonl"), [{"answer": x} for x in answers])
    rows = [("base", right, known, 0, 0.0)]
    print(f"base: {right}/{len(FACTS)} held-out facts, {known}/{len(GENERAL)} general answers", flush=True)
    for n in sizes:
        train = write_jsonl(os.path.join(root, f"train_{n}.jsonl"), chats(n))
        t = time.perf_counter()
        run = zoo.train(init_from=model, workdir=os.path.join(root, f"run_{n}"), quiet=True,
                        overrides=["task=sft", f"data.source={train}", f"data.eval_source={held}",
                                   "model.lora_rank=16", *a.sets])
        took = time.perf_counter() - t
        right, known, answers = score(zoo.load(run.workdir))
        write_jsonl(os.path.join(root, f"answers_{n}.jsonl"), [{"answer": x} for x in answers])
        rows.append((f"{n} chats", right, known, run.step, took))
        print(f"{n} chats: {run.step} steps in {took:.0f} s; {right}/{len(FACTS)} held-out facts, "
              f"{known}/{len(GENERAL)} general answers; e.g. {answers[0]!r} / {answers[len(FACTS)]!r}", flush=True)
    print("\n| set | steps | train s | held-out facts | general answers |\n| --- | --- | --- | --- | --- |")
    for name, right, known, steps, took in rows:
        print(f"| {name} | {steps or '-'} | {took:.0f} | {right}/{len(FACTS)} | {known}/{len(GENERAL)} |")


if __name__ == "__main__":
    main()
