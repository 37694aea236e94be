"""Deterministic tokenizer, chat template and pseudo-text for the simulated vLLM backend.

Shared by the simulator, the trace tools and the replay client, so that all of them agree on token
counts without a real model.  Everything here is a pure function of its inputs (no process-level
randomness: Python's ``hash`` is never applied to ``str``), fast, and documented in
docs/simulator.md.

Tokenizer
    Text is split by the regular expression ``\\s*\\S{1,8}|\\s+``: a token is an optional run of
    whitespace followed by one to eight non-space characters; trailing whitespace forms a final
    token.  Concatenating the pieces gives back the text exactly.  A piece's id is
    ``NUM_SPECIAL_TOKENS + crc32(utf-8 piece) % (VOCAB_SIZE - NUM_SPECIAL_TOKENS)``; ids below
    ``NUM_SPECIAL_TOKENS`` are reserved for the chat template.  Different pieces may share an id
    (like any hashing vocabulary); the same text always gives the same ids.

Chat template
    ``render_chat`` renders each message as ``[<role>] + tokenize(content) + [END]``; an assistant
    message's tool calls render after its content as
    ``[TOOL_CALL] + tokenize(name) + tokenize(arguments) + [TOOL_CALL_END]``; a ``tools`` list renders
    first as ``[TOOLS] + tokenize(canonical JSON) + [END]``; the generation prompt is ``[ASSISTANT]``.
    Messages are tokenized independently, so a conversation's next request (previous messages +
    the assistant reply + new user/tool messages) extends the previous prompt plus its generated
    tokens exactly, which is what makes agent prefixes cacheable as in real vLLM.

Pseudo-text
    ``generate_pieces(seed_material, n)`` draws ``n`` words (2 to 5 letters) from a fixed word list
    with ``random.Random(seed_material)`` and joins them with single spaces; every word is exactly
    one token, so the text tokenizes back to exactly ``n`` tokens.  ``text_of_tokens(n, salt)`` is
    the same with a string salt (the replay client uses it to build prompts of exact sizes).
"""

from __future__ import annotations

import json
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

VOCAB_SIZE = 131072
NUM_SPECIAL_TOKENS = 32

# Chat-template special token ids (all < NUM_SPECIAL_TOKENS).
ROLE_TOKENS: dict[str, int] = {"system": 2, "user": 3, "assistant": 4, "tool": 5, "developer": 6}
OTHER_ROLE_TOKEN = 7
END_TOKEN = 8
TOOLS_TOKEN = 9
TOOL_CALL_TOKEN = 10
TOOL_CALL_END_TOKEN = 11
ASSISTANT_TOKEN = ROLE_TOKENS["assistant"]

_PIECE_RE = re.compile(r"\s*\S{1,8}|\s+")

# piece -> id memo; bounded so that arbitrary client text cannot grow it without limit.
_ID_CACHE: dict[str, int] = {}
_ID_CACHE_MAX = 200_000

# Fixed word list for pseudo-text: 2-5 letter syllable words, so that a word plus JSON quoting
# ('"word"}') still fits in one 8-character piece.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_VOWELS = ("a", "e", "i", "o", "u")
_WORDS: tuple[str, ...] = tuple(
    sorted(
        {o + v for o in _ONSETS for v in _VOWELS}
        | {o + v + c for o in _ONSETS for v in _VOWELS for c in ("n", "r", "s")}
    )
)


def _piece_id(piece: str) -> int:
    token_id = _ID_CACHE.get(piece)
    if token_id is None:
        token_id = NUM_SPECIAL_TOKENS + zlib.crc32(piece.encode("utf-8")) % (VOCAB_SIZE - NUM_SPECIAL_TOKENS)
        if len(_ID_CACHE) >= _ID_CACHE_MAX:
            _ID_CACHE.clear()
        _ID_CACHE[piece] = token_id
    return token_id


def split_pieces(text: str) -> list[str]:
    """The token pieces of ``text``; ``"".join(split_pieces(t)) == t``."""
    return _PIECE_RE.findall(text)


def tokenize(text: str) -> list[int]:
    """Token ids of ``text`` (deterministic, no special tokens added)."""
    cache = _ID_CACHE
    out: list[int] = []
    append = out.append
    for piece in _PIECE_RE.findall(text):
        token_id = cache.get(piece)
        append(token_id if token_id is not None else _piece_id(piece))
    return out


def piece_ids(pieces: list[str]) -> list[int]:
    """Ids of already-split pieces (``tokenize("".join(p)) == piece_ids(p)`` for generated text)."""
    return [_piece_id(piece) for piece in pieces]


def count_tokens(text: str) -> int:
    return len(_PIECE_RE.findall(text))


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content`` (string, list of parts, or None)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def render_tool_call(name: str, arguments: str) -> list[int]:
    return [TOOL_CALL_TOKEN, *tokenize(name), *tokenize(arguments), TOOL_CALL_END_TOKEN]


def render_message(message: Mapping[str, Any]) -> list[int]:
    role = message.get("role")
    tokens = [ROLE_TOKENS.get(role, OTHER_ROLE_TOKEN) if isinstance(role, str) else OTHER_ROLE_TOKEN]
    tokens.extend(tokenize(content_text(message.get("content"))))
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                tokens.extend(render_tool_call(str(function.get("name", "")), str(function.get("arguments", ""))))
    tokens.append(END_TOKEN)
    return tokens


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Any] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Prompt token ids of a chat request through the fixed template (see module docstring)."""
    tokens: list[int] = []
    if tools:
        tokens.append(TOOLS_TOKEN)
        tokens.extend(tokenize(json.dumps(list(tools), sort_keys=True, separators=(",", ":"))))
        tokens.append(END_TOKEN)
    for message in messages:
        tokens.extend(render_message(message))
    if add_generation_prompt:
        tokens.append(ASSISTANT_TOKEN)
    return tokens


def generate_words(seed_material: int | str, n_words: int) -> list[str]:
    """``n_words`` deterministic pseudo-words for ``seed_material``."""
    if n_words <= 0:
        return []
    return random.Random(seed_material).choices(_WORDS, k=n_words)


def generate_pieces(seed_material: int | str, n_tokens: int) -> list[str]:
    """Token pieces of deterministic pseudo-text of exactly ``n_tokens`` tokens."""
    words = generate_words(seed_material, n_tokens)
    if not words:
        return []
    return [words[0], *[" " + w for w in words[1:]]]


def generate_text(seed_material: int | str, n_tokens: int) -> str:
    """Deterministic pseudo-text that tokenizes back to exactly ``n_tokens`` tokens."""
    return "".join(generate_pieces(seed_material, n_tokens))


def text_of_tokens(n: int, salt: str = "") -> str:
    """Text of exactly ``n`` tokens, deterministic in ``(n, salt)``; distinct salts give distinct text."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return generate_text(f"text:{salt}:{n}", n)


def tool_call_arguments(seed_material: int | str, n_words: int) -> str:
    """JSON arguments ``{"q": "<words>"}`` that tokenize to exactly ``n_words + 1`` tokens."""
    words = generate_words(seed_material, max(1, n_words))
    return '{"q": "' + " ".join(words) + '"}'
