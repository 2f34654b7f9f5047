"""DAgger: beta-mixture roll-ins of student and teacher; the teacher labels every visited state
of the actors in ``teacher.label_actors``; cross-entropy on the labels of ``dagger_dataset``
(the union over all iterations: epochs over the aggregate). The unit is a roll-in episode,
complete once it ended and each of its states is labeled or its teacher failed."""

from __future__ import annotations

from typing import ClassVar

from stacx.events import EpisodeFinished, Event, TeacherLabeled
from stacx.train.algorithms.base import Algorithm, Get, Teacher, TrainerKeys
from stacx.train.algorithms.sft import Sft


def label_actors(get: Get) -> TrainerKeys:
    """trainer.label_actors = teacher.label_actors (DAgger's and AggreVaTe's roll-in labels)."""
    key = "teacher.label_actors"
    return {"label_actors": (get(key, ["student", "teacher"]), key)}


class Dagger(Sft):
    """SFT's samples and loss on the teacher's labels."""

    name: ClassVar[str] = "dagger"
    teacher: ClassVar[Teacher] = Teacher.LABEL
    teacher_role: ClassVar[bool] = True
    roll_in: ClassVar[bool] = True
    scripted_agents: ClassVar[bool] = False
    installed_agents: ClassVar[bool] = False
    source: ClassVar[str] = "dagger_dataset"
    filter: ClassVar[str] = "prompt_matches"
    ready_view: ClassVar[str] = "ready_roll_ins"
    complete: ClassVar[str] = "u.done AND NOT list_has_any(u.unlabeled_actors, $label_actors)"
    done: ClassVar[str] = "u.done"
    waits: ClassVar[bool] = True
    wakes: ClassVar[tuple[type[Event], ...]] = (*Algorithm.wakes, EpisodeFinished, TeacherLabeled)

    def trainer_keys(self, get: Get) -> TrainerKeys:
        return label_actors(get)


ALGORITHM = Dagger()
