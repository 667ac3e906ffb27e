"""The embedded account's patches of library code: each still fits the pinned libraries, and one
that no longer does is refused by name, before anything is replaced."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import boto3
import pytest

from gpufleet.adapters.aws import runtime
from gpufleet.emulator import patches
from gpufleet.emulator.patches import PATCHES, Patch, PatchDoesNotFit
from gpufleet.emulator.sessions import SessionsSharingModels


@pytest.mark.parametrize("patch", PATCHES, ids=lambda patch: patch.name)
def test_each_patch_fits_the_pinned_libraries(patch: Patch) -> None:
    assert patch.problems() == [], (
        f"the emulator's patch of {patch.name} ({patch.why}) no longer fits the installed "
        "library: update gpufleet/emulator/patches.py for it, or pin the version it was written "
        "for in requirements.lock"
    )


def test_the_registry_names_each_patch_once_and_the_docstring_lists_them_all() -> None:
    names = [patch.name for patch in PATCHES]
    assert len(names) == len(set(names))
    doc = patches.__doc__ or ""
    for patch in PATCHES:
        assert patch.attribute.split(".")[-1] in doc, f"{patch.name} is not described"
    of_moto = sum(patch.module.startswith("moto.") for patch in PATCHES)
    stated = f"{len(PATCHES)} attributes, {of_moto} of moto and {len(PATCHES) - of_moto} of"
    assert stated in " ".join(doc.split()), "the docstring miscounts the patches"


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """A library module of the given source, importable under a fresh name."""
    name = f"gpufleet_patched_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_a_patch_whose_target_is_gone_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _module(tmp_path, monkeypatch, "class Backend: ...\n")
    patch = Patch(module, "Backend.answer", "a reason")

    assert patch.problems() == [f"{module}.Backend.answer no longer exists"]
    with pytest.raises(PatchDoesNotFit, match=r"Backend\.answer.*a reason.*requirements\.lock"):
        patch.apply(lambda original: original)


def test_a_patch_whose_target_changed_signature_is_refused_and_nothing_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _module(
        tmp_path,
        monkeypatch,
        """
        class Backend:
            def answer(self, question, *, politely):
                return question
        """,
    )
    patch = Patch(module, "Backend.answer", "a reason", ("self", "question"))
    backend = importlib.import_module(module).Backend
    original = vars(backend)["answer"]

    [problem] = patch.problems()
    assert "('self', 'question', 'politely')" in problem
    with pytest.raises(PatchDoesNotFit):
        patch.apply(lambda original: original)
    assert vars(backend)["answer"] is original


def test_a_patch_is_put_back_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = _module(
        tmp_path,
        monkeypatch,
        """
        class Backend:
            @staticmethod
            def answer(question):
                return question
        """,
    )
    backend = importlib.import_module(module).Backend
    undo = Patch(module, "Backend.answer", "a reason", ("question",)).apply(
        lambda original: staticmethod(lambda question: original(question).upper())
    )
    assert backend.answer("yes") == "YES"
    undo()
    assert isinstance(vars(backend)["answer"], staticmethod)
    assert backend.answer("yes") == "yes"


def test_a_builtin_is_shadowed_only_while_the_module_calls_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _module(tmp_path, monkeypatch, "def emit(value):\n    return str(value)\n")
    patch = Patch(module, "print", "a reason", shadows_builtin=True)

    assert patch.problems() == [f"{module}.print: the module no longer calls print()"]


def test_the_accounts_sessions_share_one_loader_of_the_service_models() -> None:
    sessions = SessionsSharingModels()
    first, second = sessions(), sessions()
    loader = first._session.get_component("data_loader")
    assert second._session.get_component("data_loader") is loader
    paths = list(loader.search_paths)
    sessions()
    assert loader.search_paths == paths  # boto3's own path, once


def test_the_control_planes_clients_come_from_the_sessions_handed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")  # a client is made offline, never called
    made: list[boto3.session.Session] = []

    def counted() -> boto3.session.Session:
        made.append(boto3.session.Session())
        return made[-1]

    undo = runtime.use_sessions(counted)
    try:
        runtime.client("s3", "us-east-1")
        assert len(made) == 1
    finally:
        undo()
    runtime.client("s3", "us-east-1")
    assert len(made) == 1
