"""Typed identifiers.

Every id is a ``str`` subclass that validates its shape on construction, so an id that reached a
file path, an SQL parameter or a topic name has already been checked: ids never contain ``/``,
``..`` or whitespace. ``StudyId("study")``, ``ExperimentId("mnist")``, ``RevisionId("rev-1")``.
"""

from __future__ import annotations

import re
from typing import ClassVar

from .errors import InvalidMessage

__all__ = [
    "ContentId",
    "DatasetId",
    "ExperimentId",
    "ExperimentKey",
    "HeadId",
    "LeaseId",
    "PeerId",
    "RevisionId",
    "ShardId",
    "StudyId",
]


class _Id(str):
    pattern: ClassVar[re.Pattern[str]] = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

    def __new__(cls, value: object) -> _Id:
        if not isinstance(value, str) or not cls.pattern.fullmatch(value) or ".." in value:
            raise InvalidMessage(f"invalid {cls.__name__}: {value!r}")
        return super().__new__(cls, value)


class StudyId(_Id):
    """A study: a family of experiments on one problem."""


class ExperimentId(_Id):
    """An experiment within a study."""


class RevisionId(_Id):
    """A revision of an experiment's configuration."""


class DatasetId(_Id):
    """A sharded dataset served by the edge."""


class ShardId(_Id):
    """One shard of a dataset."""


class LeaseId(_Id):
    """A lease issued by the edge: which shards a peer trains on in one window."""


class PeerId(_Id):
    """A peer: ``ed25519-`` followed by the first 40 hex digits of sha256(public key)."""

    pattern = re.compile(r"ed25519-[0-9a-f]{40}")


class ContentId(_Id):
    """``sha256:<hex>`` of exactly the shipped bytes."""

    pattern = re.compile(r"sha256:[0-9a-f]{64}")


class HeadId(ContentId):
    """A head is named by the content id of its artifact."""


class ExperimentKey(str):
    """``study/experiment/revision``: the address of one experiment on a network."""

    __slots__ = ()

    def __new__(cls, study: StudyId, experiment: ExperimentId, revision: RevisionId) -> ExperimentKey:
        return super().__new__(cls, f"{StudyId(study)}/{ExperimentId(experiment)}/{RevisionId(revision)}")

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (ExperimentKey.parse, (str(self),))

    @classmethod
    def parse(cls, value: object) -> ExperimentKey:
        if not isinstance(value, str) or value.count("/") != 2:
            raise InvalidMessage(f"invalid experiment key: {value!r}")
        study, experiment, revision = value.split("/")
        return cls(StudyId(study), ExperimentId(experiment), RevisionId(revision))

    @property
    def parts(self) -> tuple[StudyId, ExperimentId, RevisionId]:
        study, experiment, revision = self.split("/")
        return StudyId(study), ExperimentId(experiment), RevisionId(revision)
