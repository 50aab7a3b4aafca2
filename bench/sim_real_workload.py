"""The mixed workloads the sim-to-real benchmark drives the real default stack with.

A workload is a schedule drawn from a seed before the run (so the same workload can be
run twice, against two stacks): voice chains (ASR of a spoken utterance -> a streamed
chat reply -> TTS of the reply, each step sent when the one before answered), chat
streams to ``chat`` and ``completion``, single embedding and detection requests,
embedding jobs through ``/v1/jobs``, bursts (several requests at once), and the stack's
own cameras. :class:`Driver` plays a schedule against a daemon, one thread per item.

Workloads: ``calibration`` (the one the cost model is calibrated and checked on),
``holdout`` (another mix, other sizes, another seed: the unseen workload of the
benchmark, run only once the cost model was settled) and ``unseen`` (a third mix, heavier
on chat and completion, run while the cost model was being fixed).
"""

from __future__ import annotations

import base64
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

UTTERANCES = (
    "What is the weather going to be like tomorrow morning in the city?",
    "Turn on the lights in the kitchen and set them to half brightness.",
    "Remind me to call the plumber at four o'clock this afternoon.",
    "How long does it take to boil an egg?",
    "Play some quiet music in the living room.",
    "Is the front door locked?",
)
SYSTEM = "You are a voice assistant. Answer in one short sentence."
TOPICS = ("garden", "invoice", "holiday", "recipe", "router", "school", "car", "doctor")
WORDS = (
    "the",
    "house",
    "needs",
    "a",
    "new",
    "roof",
    "before",
    "winter",
    "and",
    "the",
    "gutters",
    "are",
    "full",
    "of",
    "leaves",
    "so",
    "we",
    "should",
    "call",
    "someone",
    "who",
    "can",
    "look",
    "at",
    "the",
    "chimney",
    "too",
    "while",
    "they",
    "are",
    "up",
    "there",
    "and",
    "maybe",
    "check",
    "the",
    "insulation",
    "in",
    "the",
    "attic",
    "because",
    "the",
    "heating",
    "bill",
    "was",
    "high",
    "last",
    "year",
)


@dataclass(frozen=True, slots=True)
class Item:
    at_s: float
    kind: str  # voice | chat | completion | embed | detect | job | burst
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Mix:
    """Mean gaps (seconds) between items of each kind, and their sizes."""

    voice_gap_s: float
    chat_gap_s: float
    completion_gap_s: float
    embed_gap_s: float
    detect_gap_s: float
    chat_tokens: tuple[int, int]
    completion_tokens: tuple[int, int]
    prompt_words: tuple[int, int]
    embed_texts: tuple[int, int]
    jobs_at: tuple[float, ...]
    job_texts: int
    bursts: int
    cameras_fps: tuple[float, ...]


MIXES = {
    "calibration": Mix(
        voice_gap_s=25.0,
        chat_gap_s=60.0,
        completion_gap_s=30.0,
        embed_gap_s=20.0,
        detect_gap_s=40.0,
        chat_tokens=(32, 96),
        completion_tokens=(16, 64),
        prompt_words=(20, 200),
        embed_texts=(1, 16),
        jobs_at=(0.15, 0.6),
        job_texts=2560,
        bursts=2,
        cameras_fps=(1.0, 1.0),
    ),
    "unseen": Mix(
        voice_gap_s=35.0,
        chat_gap_s=40.0,
        completion_gap_s=20.0,
        embed_gap_s=45.0,
        detect_gap_s=25.0,
        chat_tokens=(48, 128),
        completion_tokens=(24, 96),
        prompt_words=(50, 300),
        embed_texts=(4, 32),
        jobs_at=(0.35,),
        job_texts=4000,
        bursts=3,
        cameras_fps=(2.0,),
    ),
}
MIXES["holdout"] = Mix(
    voice_gap_s=30.0,
    chat_gap_s=45.0,
    completion_gap_s=35.0,
    embed_gap_s=30.0,
    detect_gap_s=30.0,
    chat_tokens=(40, 120),
    completion_tokens=(20, 80),
    prompt_words=(30, 250),
    embed_texts=(2, 24),
    jobs_at=(0.25, 0.7),
    job_texts=3000,
    bursts=2,
    cameras_fps=(1.5,),
)
SEEDS = {"calibration": 36, "unseen": 3636, "holdout": 4242}


def _poisson(rng: random.Random, gap: float, span: float, start: float = 5.0) -> list[float]:
    out, t = [], start
    while True:
        t += rng.expovariate(1.0 / gap)
        if t >= span:
            return out
        out.append(t)


def prompt_text(rng: random.Random, words: tuple[int, int]) -> str:
    n = rng.randint(*words)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def texts(rng: random.Random, n: int) -> list[str]:
    return [
        f"Note about the {rng.choice(TOPICS)}: " + " ".join(rng.choice(WORDS) for _ in range(12))
        for _ in range(n)
    ]


def schedule(name: str, span_s: float) -> list[Item]:
    """The workload ``name`` over ``span_s`` seconds, drawn from its seed."""
    mix, rng = MIXES[name], random.Random(SEEDS[name])
    items: list[Item] = []
    for t in _poisson(rng, mix.voice_gap_s, span_s):
        items.append(Item(t, "voice", {"utterance": rng.randrange(len(UTTERANCES))}))
    for t in _poisson(rng, mix.chat_gap_s, span_s):
        items.append(
            Item(
                t,
                "chat",
                {
                    "prompt": prompt_text(rng, mix.prompt_words),
                    "max_tokens": rng.randint(*mix.chat_tokens),
                },
            )
        )
    for t in _poisson(rng, mix.completion_gap_s, span_s):
        items.append(
            Item(
                t,
                "completion",
                {
                    "prompt": prompt_text(rng, mix.prompt_words),
                    "max_tokens": rng.randint(*mix.completion_tokens),
                },
            )
        )
    for t in _poisson(rng, mix.embed_gap_s, span_s):
        items.append(Item(t, "embed", {"texts": texts(rng, rng.randint(*mix.embed_texts))}))
    for t in _poisson(rng, mix.detect_gap_s, span_s):
        items.append(Item(t, "detect", {}))
    for frac in mix.jobs_at:
        items.append(Item(frac * span_s, "job", {"texts": texts(rng, mix.job_texts)}))
    for _ in range(mix.bursts):
        t = rng.uniform(0.1, 0.9) * span_s
        burst = [Item(t, "embed", {"texts": texts(rng, rng.randint(8, 32))}) for _ in range(4)]
        burst += [Item(t, "detect", {}) for _ in range(3)]
        burst += [
            Item(
                t,
                "completion",
                {"prompt": prompt_text(rng, mix.prompt_words), "max_tokens": 48},
            )
            for _ in range(2)
        ]
        items.append(Item(t, "burst", {"items": burst}))
    return sorted(items, key=lambda i: i.at_s)


class Driver:
    """Plays a schedule against a daemon (``tests.stack.support.Daemon``)."""

    def __init__(self, daemon: Any, wavs: list[bytes], image_b64: str) -> None:
        self.daemon = daemon
        self.wavs = wavs
        self.image = image_b64
        self.errors: list[str] = []
        self.done: dict[str, int] = {}
        self._lock = threading.Lock()
        self._clients = threading.local()

    def _client(self) -> Any:
        client = getattr(self._clients, "client", None)
        if client is None:
            import openai

            client = openai.OpenAI(
                base_url=self.daemon.url + "/v1", api_key="none", max_retries=0, timeout=300
            )
            self._clients.client = client
        return client

    def _count(self, kind: str) -> None:
        with self._lock:
            self.done[kind] = self.done.get(kind, 0) + 1

    def _stream(
        self, model: str, messages: list[dict[str, str]] | None, prompt: str, n: int
    ) -> str:
        client = self._client()
        out: list[str] = []
        if messages is not None:
            stream = client.chat.completions.create(
                model=model, messages=messages, max_tokens=n, temperature=0, stream=True
            )
            for chunk in stream:
                if chunk.choices:
                    out.append(chunk.choices[0].delta.content or "")
        else:
            stream = client.completions.create(
                model=model, prompt=prompt, max_tokens=n, temperature=0, stream=True
            )
            for chunk in stream:
                if chunk.choices:
                    out.append(chunk.choices[0].text or "")
        return "".join(out)

    def run_item(self, item: Item) -> None:
        try:
            self._run(item)
            self._count(item.kind)
        except Exception as exc:  # a refusal or error is an outcome, recorded by the daemon
            with self._lock:
                self.errors.append(f"{item.kind}: {type(exc).__name__}: {str(exc)[:120]}")

    def _run(self, item: Item) -> None:
        p, client = item.params, self._client()
        if item.kind == "voice":
            wav = self.wavs[p["utterance"] % len(self.wavs)]
            heard = client.audio.transcriptions.create(
                model="asr", file=("u.wav", wav, "audio/wav")
            ).text
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": heard}]
            reply = self._stream("voice", messages, "", 24) or "Sorry."
            client.audio.speech.create(model="tts", voice="joe", input=reply).read()
        elif item.kind == "chat":
            self._stream("chat", [{"role": "user", "content": p["prompt"]}], "", p["max_tokens"])
        elif item.kind == "completion":
            self._stream("completion", None, p["prompt"], p["max_tokens"])
        elif item.kind == "embed":
            client.embeddings.create(model="embeddings", input=p["texts"])
        elif item.kind == "detect":
            client.post(
                "/detections", body={"model": "detect", "image": self.image}, cast_to=object
            )
        elif item.kind == "job":
            client.post("/jobs", body={"model": "indexer", "inputs": p["texts"]}, cast_to=object)
        elif item.kind == "burst":
            threads = [threading.Thread(target=self.run_item, args=(i,)) for i in p["items"]]
            for th in threads:
                th.start()
            for th in threads:
                th.join()

    def play(self, items: list[Item], *, started: float | None = None) -> float:
        """Run every item at its time (from ``started``, default now); returns when the
        last one has answered. Each item runs in a thread of its own."""
        t0 = time.monotonic() if started is None else started
        threads: list[threading.Thread] = []
        for item in items:
            delay = t0 + item.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            th = threading.Thread(target=self.run_item, args=(item,), daemon=True)
            th.start()
            threads.append(th)
        for th in threads:
            th.join(600)
        return time.monotonic() - t0


def image_b64() -> str:
    from tests.stack.support import astronaut_jpeg

    return base64.b64encode(astronaut_jpeg()).decode()


def speech_wavs() -> list[bytes]:
    from accelmux.models import PiperSpeaker

    speaker = PiperSpeaker()
    speaker.load()
    out = [bytes(speaker.synthesize(u).wav) for u in UTTERANCES]
    speaker.unload()
    return out
