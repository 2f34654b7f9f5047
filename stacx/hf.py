"""Process-wide guard for loading transformers models.

``from_pretrained`` is not thread-safe: it initialises weights on the meta device through
global state, so two loads in two threads (the trainer, the student engine and the teacher
engine all start at once under local placement) can leave one model with meta tensors
("Cannot copy out of meta tensor"). Every engine loads models under this one lock.
"""

from __future__ import annotations

import threading

LOAD_LOCK = threading.RLock()
