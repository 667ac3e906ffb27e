"""The output contract every command keeps (docs/cli.md, "Output, errors and exit codes").

- Results go to stdout: text for people, or JSON with `--json` (every command takes it).
- Errors go to stderr, one way for every command: `gpufleet: MESSAGE` (and the fields of a
  refused spec under it), or with `--json` one object of a shape that never changes,
  `{"error": CODE, "message": TEXT, "details": {...}}`, CODE one of `ErrorCode`.
- Exit codes: 0 success, 2 refused or not found (bad input, a refused spec, an unknown job, no
  gpufleet to talk to: something the user can fix), 1 an unexpected failure. `gpufleet run` and
  `logs --follow` exit with the job's own code instead (`JobExit`).
- No traceback unless `--debug`: the runner turns every exception into an error of the contract.

Commands raise `CliError` (or a domain exception the runner knows) instead of printing their
own errors; `run_command` is the one place that reports them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, NoReturn, TextIO

from gpufleet.cli.table import printable
from gpufleet.errors import GpufleetError

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_REFUSED = 2
# The shell's code for a process ended by SIGINT (128 + 2): Ctrl-C.
EXIT_INTERRUPTED = 130


class ErrorCode(StrEnum):
    INVALID_ARGUMENTS = "InvalidArguments"  # a flag or argument the command cannot use
    INVALID_JOB_SPEC = "InvalidJobSpec"  # the spec was refused (intake's code)
    INVALID_CONFIG = "InvalidConfig"  # the policy file cannot be read or is invalid
    NOT_FOUND = "NotFound"  # no such job, log group, stack, region in the catalog, file
    REFUSED = "Refused"  # the control plane said no: a job that ended, a booking it refuses
    NO_FEASIBLE_OFFERING = "NoFeasibleOffering"  # nothing in the catalog can hold the job
    NO_TARGET = "NoTarget"  # no gpufleet to talk to: variables, region or credentials missing
    UNREACHABLE = "Unreachable"  # the endpoint does not answer (emulator down, no network)
    AWS_ERROR = "AwsError"  # an AWS API refused a call (access denied, throttled, ...)
    DATA_MISSING = "DataMissing"  # data a command needs is not where it looks (simulate)
    UNEXPECTED = "Unexpected"  # a bug, or a failure nobody foresaw: exit 1


class CliError(GpufleetError):
    """A failure reported to the user as the contract says: code, message, details."""

    def __init__(
        self,
        message: str,
        code: ErrorCode = ErrorCode.REFUSED,
        details: Mapping[str, Any] | None = None,
        exit_code: int = EXIT_REFUSED,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = dict(details or {})
        self.exit_code = exit_code

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.code.value, "message": self.message, "details": self.details}


def invalid(message: str) -> CliError:
    return CliError(message, ErrorCode.INVALID_ARGUMENTS)


def not_found(message: str) -> CliError:
    return CliError(message, ErrorCode.NOT_FOUND)


class Parser(argparse.ArgumentParser):
    """Every parser of the CLI. A usage error is a `CliError` (so that `--json` gets it as
    JSON), and every command's parser gets `--json` and `--debug`. `conflict_handler` lets a
    command that declares `--json` itself (with its own help) keep doing so."""

    def __init__(self, *args: Any, common_flags: bool = True, **kwargs: Any) -> None:
        kwargs.setdefault("conflict_handler", "resolve")
        super().__init__(*args, **kwargs)
        if common_flags:
            self.add_argument(
                "--json", action="store_true", help="print JSON (errors: JSON on stderr)"
            )
            self.add_argument(
                "--debug", action="store_true", help="show the traceback of an unexpected error"
            )

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see {self.prog} --help)", ErrorCode.INVALID_ARGUMENTS)


def print_json(document: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(document, indent=2), file=stream or sys.stdout, flush=True)


def report(error: CliError, as_json: bool, stream: TextIO | None = None) -> int:
    """Print `error` on stderr as the contract says; the exit code to return."""
    out = stream or sys.stderr
    if as_json:
        print(json.dumps(error.to_dict()), file=out)
        return error.exit_code
    print(f"gpufleet: {printable(error.message)}", file=out)
    for problem in error.details.get("fields", []):
        print(printable(f"  {problem['field']}: {problem['message']}"), file=out)
    return error.exit_code


def run_command(args: argparse.Namespace) -> int:
    """Run the parsed command; whatever goes wrong is reported as the contract says."""
    as_json = bool(getattr(args, "json", False))
    try:
        code: int = args.run(args)
        return code
    except KeyboardInterrupt:
        return report(CliError("interrupted", exit_code=EXIT_INTERRUPTED), as_json)
    except BrokenPipeError:
        return EXIT_OK  # the reader (`| head`) has all it wanted
    except Exception as exc:
        if getattr(args, "debug", False) and not isinstance(exc, CliError):
            raise
        return report(describe(exc), as_json)


def describe(exc: BaseException) -> CliError:
    """`exc` as an error of the contract: what it means for the user, and the exit code."""
    if isinstance(exc, CliError):
        return exc
    known = _domain_error(exc) or _aws_error(exc)
    if known is not None:
        return known
    return CliError(
        f"unexpected {type(exc).__name__}: {exc} (run again with --debug for the traceback)",
        ErrorCode.UNEXPECTED,
        {"exception": type(exc).__name__},
        EXIT_UNEXPECTED,
    )


def _domain_error(exc: BaseException) -> CliError | None:
    from gpufleet.domain.config import ConfigFileError
    from gpufleet.domain.job import JobNotFound
    from gpufleet.domain.queueing import BookingNotFound, BookingRefused
    from gpufleet.domain.selection import NoFeasibleOffering
    from gpufleet.domain.spec import SpecError
    from gpufleet.services.lifecycle_base import JobAlreadyEnded

    if isinstance(exc, SpecError):
        document = exc.to_dict()
        details = {k: v for k, v in document.items() if k not in ("error", "message")}
        return CliError(exc.message, ErrorCode.INVALID_JOB_SPEC, details)
    if isinstance(exc, JobNotFound):
        return CliError(str(exc), ErrorCode.NOT_FOUND, {"job_id": exc.job_id})
    if isinstance(exc, BookingNotFound):
        return CliError(str(exc), ErrorCode.NOT_FOUND, {"booking_id": exc.booking_id})
    if isinstance(exc, JobAlreadyEnded | BookingRefused):
        return CliError(str(exc), ErrorCode.REFUSED)
    if isinstance(exc, NoFeasibleOffering):
        return CliError(
            exc.message,
            ErrorCode.NO_FEASIBLE_OFFERING,
            {"constraint": exc.constraint, "region": exc.region},
        )
    if isinstance(exc, ConfigFileError):
        return CliError(str(exc), ErrorCode.INVALID_CONFIG)
    return None


# ClientError codes that say "try again later", not "you may not": an unexpected failure.
_TRANSIENT = ("Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests")


def _aws_error(exc: BaseException) -> CliError | None:
    from botocore import exceptions as boto

    if isinstance(exc, boto.NoCredentialsError | boto.PartialCredentialsError):
        return CliError(
            f"no AWS credentials ({exc}): configure a profile (aws configure / aws sso login) "
            "or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the emulator's are in its "
            "--env-file)",
            ErrorCode.NO_TARGET,
        )
    if isinstance(exc, boto.NoRegionError):
        return CliError("no AWS region: give --region, or export AWS_REGION", ErrorCode.NO_TARGET)
    if isinstance(exc, boto.EndpointConnectionError | boto.ConnectionError):
        endpoint = getattr(exc, "kwargs", {}).get("endpoint_url", "")
        return CliError(
            f"{exc} (no network? for the emulator: is `gpufleet emulator` still running there?)",
            ErrorCode.UNREACHABLE,
            {"endpoint_url": endpoint} if endpoint else None,
        )
    if isinstance(exc, boto.ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500)
        aws_code = str(error.get("Code", "Unknown"))
        transient = aws_code in _TRANSIENT or status >= 500
        return CliError(
            f"{exc.operation_name}: {aws_code}: {error.get('Message', '')}",
            ErrorCode.AWS_ERROR,
            {"aws_code": aws_code, "operation": exc.operation_name, "http_status": status},
            EXIT_UNEXPECTED if transient else EXIT_REFUSED,
        )
    if isinstance(exc, boto.BotoCoreError):
        return CliError(f"AWS: {exc}", ErrorCode.NO_TARGET)
    return None
