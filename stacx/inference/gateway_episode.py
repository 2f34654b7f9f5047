"""What the model gateway remembers of one episode's calls: its credential, the segment its
calls are in (a prompt that does not extend an earlier call's prompt + output opens a new one),
the previous turn's ids (so a turn is stored as the ids after them), and the exact text the
model wrote for the tool calls it returned (so an echoed history re-renders token for token);
a history that echoes a reply the tokenizer would split otherwise continues from the model's
own ids (`prompt_ids`)."""

from __future__ import annotations

import asyncio
from typing import Any

from stacx.events import Emit, GatewayRefused, derive_id, new_id
from stacx.ports import ChatTokenizer, Generation, turn_generated


class GatewayEpisode:
    """One episode's route through the gateway: its credential and what its calls recorded."""

    def __init__(self, *, run_id: str, episode_id: str, emit: Emit) -> None:
        self.run_id, self.episode_id, self.emit = run_id, episode_id, emit
        self.credential = f"stacx-{new_id()}"
        self.n_turns = 0  # turns recorded so far (one per choice)
        self.segment = 0
        self.transcript_ids: list[int] = []  # the last call's prompt + output (choice 0)
        self._ends: list[list[int]] = []  # prompt + output of each choice of the last call
        self._raw: dict[tuple[str, ...], str] = {}  # tool-call ids -> the text the model wrote
        self.lock = asyncio.Lock()
        self.n_refused = 0  # error answers recorded so far

    async def refused(self, route: str, status: int, error: dict[str, Any]) -> None:
        """Record an error answer to one of this episode's calls (`GatewayRefused`)."""
        n, self.n_refused = self.n_refused, self.n_refused + 1
        await self.emit(
            GatewayRefused(
                run_id=self.run_id,
                event_id=derive_id(self.episode_id, "refused", n),
                episode_id=self.episode_id,
                route=route,
                status=status,
                error_type=str(error.get("type") or ""),
                code=str(error.get("code") or ""),
                param=str(error.get("param") or ""),
                message=str(error.get("message") or ""),
            )
        )

    def remember(self, call_ids: tuple[str, ...], text: str) -> None:
        """The text the model wrote for the tool calls it returned with these ids."""
        self._raw[call_ids] = text

    def raw_text(self, call_ids: tuple[str, ...]) -> str | None:
        return self._raw.get(call_ids)

    def extends(self, ids: list[int]) -> bool:
        """Whether `ids` continue the episode's current segment: there is no call yet, or they
        extend a choice of the last call (its prompt + output)."""
        return not self._ends or any(ids[: len(e)] == e for e in self._ends)

    def prompt_ids(self, text: str, tok: ChatTokenizer) -> list[int]:
        """`text` (the rendered conversation) as prompt ids that keep the model's own tokens:
        where the text extends the text of an earlier choice's prompt + output but its
        tokenization does not extend those ids (the model sampled a non-canonical split, such
        as two newlines as two tokens, or a reply cut mid-word at max_tokens), the ids are that
        choice's ids + the rest of the text encoded: what the engine continues from, and one
        segment to train on, is what the model saw and wrote. Otherwise, the text encoded."""
        ids = list(tok.encode(text, add_special_tokens=False))
        if self.extends(ids):
            return ids
        for end in reversed(self._ends):
            seen = tok.decode(end, skip_special_tokens=False)
            if seen and text.startswith(seen):
                return end + list(tok.encode(text[len(seen) :], add_special_tokens=False))
        return ids

    async def record(
        self,
        gens: list[Generation],
        prompts: list[list[int]],
        *,
        engine: str,
        request_id: str,
        request_json: str,
    ) -> None:
        """Emit one call's choices as `TurnGenerated` events, in order. Stored linearly: a
        prompt that extends the previous turn's (the last choice of the last call) prompt +
        output keeps only its new ids, with prefix_len; a first choice whose prompt extends no
        choice of the last call opens a new segment."""
        async with self.lock:
            if not self.extends(prompts[0]):
                self.segment += 1
            previous = self._ends[-1] if self._ends else []
            events, ends = [], []
            for i, (gen, prompt) in enumerate(zip(gens, prompts, strict=True)):
                events.append(
                    turn_generated(
                        gen,
                        run_id=self.run_id,
                        episode_id=self.episode_id,
                        turn=self.n_turns,
                        prompt=prompt,
                        previous_end=previous,
                        engine=engine,
                        segment=self.segment,
                        request_id=request_id,
                        choice_index=i,
                        request_json=request_json if i == 0 else "",
                    )
                )
                self.n_turns += 1
                previous = prompt + gen.output_ids
                ends.append(previous)
            self._ends, self.transcript_ids = ends, ends[0]
            await asyncio.gather(*(self.emit(e) for e in events))
