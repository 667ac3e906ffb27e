"""The one code zip of the stack: what the functions run and what the GPU nodes' agent downloads.

It holds the gpufleet package and the dependencies that neither the Lambda runtime (boto3) nor
the Powertools layer (Powertools, pydantic, the X-Ray SDK) provides: `BUNDLED_DISTRIBUTIONS`.
By default it is built at every synth, offline, from `functions/` and from those distributions as
installed here (the versions requirements.lock pins), their pure-Python files only: a compiled
module built for this interpreter would not load in the Lambda runtime (python3.12), and the
distributions listed run without theirs (PyYAML falls back to its pure-Python parser).

`-c lambda_asset=DIR` ships a directory built elsewhere instead (for example with libyaml built
for python3.12); synth refuses one that lacks the package or a dependency.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePath

from aws_cdk import Stage
from aws_cdk import aws_s3_assets as s3_assets

from constructs import Construct
from infra.config import ConfigError

PACKAGE = "gpufleet"
BUNDLED_DISTRIBUTIONS = ("PyYAML",)
# Never shipped: caches, build metadata, tests.
IGNORED = (
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "tests",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
)
COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
# The bundle is staged here, inside the cloud assembly, and rebuilt at every synth.
STAGING_FOLDER = "gpufleet-code"


@dataclass(frozen=True)
class CodeSource:
    """Where the zip comes from: a folder holding `gpufleet/`, and whether the dependencies
    are to be added to it (False: the folder already holds them)."""

    folder: Path
    add_dependencies: bool


def code_source(lambda_asset: str, repository: Path) -> CodeSource:
    """The default bundle from `repository/functions`, or the `lambda_asset` folder, checked."""
    if not lambda_asset:
        return CodeSource(repository / "functions", add_dependencies=True)
    folder = Path(lambda_asset)
    if not folder.is_absolute():
        folder = repository / folder
    if not folder.is_dir():
        raise ConfigError(f"lambda_asset {folder} is not a directory")
    missing = [name for name in (PACKAGE, *_top_level_names()) if not _holds(folder, name)]
    if missing:
        raise ConfigError(
            f"lambda_asset {folder} lacks {', '.join(missing)}, which the functions import and "
            "neither the Lambda runtime nor the Powertools layer provides. Leave lambda_asset "
            f"unset (synth then bundles {PACKAGE} with {', '.join(BUNDLED_DISTRIBUTIONS)}), or "
            "add what is missing."
        )
    return CodeSource(folder, add_dependencies=False)


def code_asset(scope: Construct, construct_id: str, source: CodeSource) -> s3_assets.Asset:
    stage = Stage.of(scope)
    assert stage is not None, "a code asset belongs to an app"
    staging = Path(stage.outdir) / STAGING_FOLDER
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source.folder, staging, ignore=shutil.ignore_patterns(*IGNORED))
    if source.add_dependencies:
        for name in BUNDLED_DISTRIBUTIONS:
            _copy_pure_python(metadata.distribution(name), staging)
    return s3_assets.Asset(scope, construct_id, path=str(staging))


def _copy_pure_python(distribution: metadata.Distribution, into: Path) -> None:
    for file in distribution.files or ():
        if file.suffix in COMPILED_SUFFIXES or not _shipped(file):
            continue
        target = into / file
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(str(distribution.locate_file(file))), target)


def _shipped(file: PurePath) -> bool:
    """Files of an installed distribution worth shipping: no caches, and no RECORD, whose
    list and hashes would name the compiled modules left out."""
    if any(PurePath(part).match(pattern) for part in file.parts for pattern in IGNORED):
        return False
    return not (file.parts[0].endswith(".dist-info") and file.name in ("RECORD", "INSTALLER"))


def _top_level_names() -> list[str]:
    """The importable names of the bundled distributions (`yaml`, `_yaml` for PyYAML)."""
    names: set[str] = set()
    for name in BUNDLED_DISTRIBUTIONS:
        for file in metadata.distribution(name).files or ():
            top = file.parts[0]
            if len(file.parts) > 1 and not top.endswith((".dist-info", ".data")):
                names.add(top)
            elif file.suffix == ".py" and len(file.parts) == 1:
                names.add(file.stem)
    return sorted(names - {"__pycache__"})


def _holds(folder: Path, name: str) -> bool:
    return (folder / name / "__init__.py").is_file() or (folder / f"{name}.py").is_file()
