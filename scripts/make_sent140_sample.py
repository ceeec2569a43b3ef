"""Write ``sent140-sample``: a small data set in LEAF's Sent140 format, with natural clients, shipped with Phalanx.

What it is — said plainly wherever it is used: **synthetic** tweets, written by this script from the word lists below
(made up here, no Sentiment140 tweet is copied: Sentiment140's tweets are Twitter users' text and cannot be shipped),
grouped by 60 made-up users, in exactly the files LEAF's ``preprocess.sh`` writes for Sent140 (``train/`` and
``test/`` JSON, ``x = [id, date, query, user, text]``, ``y`` 0 = negative, 1 = positive; Caldas et al.,
arXiv:1812.01097). Each user has a mood (the share of positive tweets, drawn from Beta(0.7, 0.7), so most users lean
one way: the clients are not identically distributed), a few favourite topics and a writing style (emoticons,
hashtags, capitals). A tweet's label is its sentiment; a tenth of the phrases are ambiguous or sarcastic, so no
model reaches 100 %. Four held-out tweets per user form ``test/``.

Run (deterministic)::

    python scripts/make_sent140_sample.py --out src/phalanx/data/_files/sent140-sample
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

POSITIVE = [
    "loving", "so happy about", "can't stop smiling at", "really enjoyed", "grateful for", "excited about",
    "had a great time at", "best day ever with", "totally recommend", "proud of", "feeling good about",
    "finally nailed", "so much fun at", "thrilled about", "what a lovely",
]
NEGATIVE = [
    "hate", "so tired of", "can't stand", "really disappointed with", "annoyed by", "sick of", "worst day ever with",
    "never again with", "stuck with", "fed up with", "sad about", "gave up on", "so bored of", "angry about",
    "what a terrible",
]
AMBIGUOUS = [  # sarcasm and mixed feelings: the label is the writer's, not the words'
    "oh great, more", "just what i needed,", "not bad but not great,", "could be worse:", "kind of miss",
]
TOPICS = [
    "the new phone", "monday morning", "my coffee", "the train", "this weather", "the concert", "my garden",
    "the homework", "work today", "the match", "my bike", "the movie last night", "dinner", "the exam",
    "my playlist", "the beach", "the traffic", "our team", "the book club", "the new job",
]
TAILS_POS = ["!", " :)", " :D", " <3", "!!", " yay", ""]
TAILS_NEG = ["...", " :(", " ugh", "!!", " :/", " meh", ""]
TAGS = ["#life", "#mood", "#friday", "#blessed", "#fail", "#weekend", "#work"]
DATE = "Mon Apr 06 22:19:45 PDT 2009"


def tweet(rng: random.Random, positive: bool, topics: list[str], style: dict[str, float]) -> str:
    """One tweet of the given sentiment in a user's style."""
    if rng.random() < 0.1:
        phrase = rng.choice(AMBIGUOUS)
    else:
        phrase = rng.choice(POSITIVE if positive else NEGATIVE)
    text = f"{phrase} {rng.choice(topics)}{rng.choice(TAILS_POS if positive else TAILS_NEG)}"
    if rng.random() < style["tag"]:
        text += " " + rng.choice(TAGS)
    if rng.random() < style["caps"]:
        text = text.upper()
    if rng.random() < style["mention"]:
        text = f"@friend{rng.randrange(100)} " + text
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--users", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    train: dict[str, dict[str, list]] = {}
    test: dict[str, dict[str, list]] = {}
    tweet_id = 1467810000
    for u in range(args.users):
        user = f"user{u:03d}"
        mood = rng.betavariate(0.7, 0.7)
        topics = rng.sample(TOPICS, 4)
        style = {"tag": rng.random() * 0.5, "caps": rng.random() * 0.15, "mention": rng.random() * 0.4}
        count = rng.randint(10, 30)
        for split, k in ((train, count), (test, 4)):
            xs, ys = [], []
            for _ in range(k):
                positive = rng.random() < mood
                tweet_id += rng.randint(1, 50)
                xs.append([str(tweet_id), DATE, "NO_QUERY", user, tweet(rng, positive, topics, style)])
                ys.append(int(positive))
            split[user] = {"x": xs, "y": ys}
    for name, split in (("train", train), ("test", test)):
        folder = args.out / name
        folder.mkdir(parents=True, exist_ok=True)
        users = sorted(split)
        doc = {"users": users, "num_samples": [len(split[u]["y"]) for u in users], "user_data": split}
        (folder / f"all_data_0_niid_0_keep_0_{name}_9.json").write_text(json.dumps(doc) + "\n")
    print(f"{sum(len(v['y']) for v in train.values())} training and {sum(len(v['y']) for v in test.values())} test "
          f"tweets of {args.users} users in {args.out}")


if __name__ == "__main__":
    main()
