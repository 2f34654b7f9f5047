"""What the model gateway remembers of one episode's calls: its credential, its segment, the
previous turn's ids, and the exact text of the tool calls the model wrote, so an echoed history
continues token for token. Design: docs/scaffolds.md#segments-what-a-multi-segment-episode-trains-on
"""

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
        self.n_calls = 0  # model calls received so far, answered or not
        self.segment = 0
        self.transcript_ids: list[int] = []  # the last call's prompt + output (choice 0)
        self._ends: list[list[int]] = []  # prompt + output of each choice of the last call
        self.raw_texts: dict[tuple[str, ...], str] = {}  # tool-call ids -> what the model wrote
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

    def extends(self, ids: list[int]) -> bool:
        """Whether `ids` continue the episode's current segment: there is no call yet, or they
        extend a choice of the last call (its prompt + output)."""
        return not self._ends or any(ids[: len(e)] == e for e in self._ends)

    def prompt_ids(self, text: str, tok: ChatTokenizer) -> list[int]:
        """The rendered `text` as prompt ids: where it extends an earlier choice's prompt + output
        whose ids its encoding would not extend (a non-canonical split, a reply cut mid-word),
        that choice's ids + the rest encoded, so the segment goes on; else the text encoded."""
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
        """Emit one call's choices as `TurnGenerated` events: a prompt extending the previous
        turn keeps only its new ids (prefix_len); one extending no choice opens a segment."""
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
