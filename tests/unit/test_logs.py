"""What commands log (common/logs.py): progress on stdout and warnings on stderr as print put
them, the level and a file from the environment, rank 0 alone showing progress under
torchrun, and each command's set-up undone when it returns."""

from __future__ import annotations

import logging

import pytest

from ropelab.common.cli import entry_point
from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger

logger = get_logger("tests.logs")


@entry_point
def chatty(argv=None) -> int:
    logger.debug("debug detail")
    logger.info("evaluating runs/x")
    logger.warning("warning: something odd")
    return 0


def test_a_commands_progress_goes_to_stdout_and_its_warnings_to_stderr_as_printed(capsys):
    assert chatty() == 0
    out, err = capsys.readouterr()
    assert out == "evaluating runs/x\n" and err == "warning: something odd\n"


def test_the_level_comes_from_the_environment_and_a_wrong_one_is_a_user_error(capsys, monkeypatch):
    monkeypatch.setenv("ROPELAB_LOG_LEVEL", "warning")
    assert chatty() == 0
    assert capsys.readouterr() == ("", "warning: something odd\n")
    monkeypatch.setenv("ROPELAB_LOG_LEVEL", "debug")
    assert chatty() == 0
    assert capsys.readouterr().out == "debug detail\nevaluating runs/x\n"
    monkeypatch.setenv("ROPELAB_LOG_LEVEL", "loud")
    assert chatty() == 2
    assert capsys.readouterr().err.startswith("error: ROPELAB_LOG_LEVEL='LOUD': expected one of DEBUG, INFO")


def test_only_rank_0_shows_progress_under_torchrun(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    assert chatty() == 0
    assert capsys.readouterr() == ("", "warning: something odd\n")


def test_a_log_file_gets_every_message_with_its_time_level_and_module(tmp_path, capsys, monkeypatch):
    path = tmp_path / "command.log"
    monkeypatch.setenv("ROPELAB_LOG_FILE", str(path))
    assert chatty() == 0
    lines = path.read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["INFO ropelab.tests.logs: evaluating runs/x",
                                                         "WARNING ropelab.tests.logs: warning: something odd"]
    assert capsys.readouterr().out == "evaluating runs/x\n"  # the console as without the file


def test_a_command_leaves_logging_as_it_found_it(capsys, caplog):
    """Outside a command nothing is set up: a library call shows warnings only (caplog sees all)."""
    root = logging.getLogger("ropelab")
    before = (list(root.handlers), root.level)
    assert chatty() == 0
    assert (list(root.handlers), root.level) == before
    capsys.readouterr()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ropelab"):
        logger.info("evaluating runs/y")
    assert capsys.readouterr() == ("", "") and caplog.messages == ["evaluating runs/y"]


def test_an_error_line_stays_a_print_on_stderr(capsys):
    @entry_point
    def refuses(argv=None) -> int:
        logger.info("starting")
        raise UserError("no such run")

    assert refuses() == 2
    assert capsys.readouterr() == ("starting\n", "error: no such run\n")


@pytest.mark.parametrize("name, expected", [("ropelab.grid.local", "ropelab.grid.local"), ("__main__", "ropelab.__main__")])
def test_every_module_logs_under_ropelab(name, expected):
    assert get_logger(name).name == expected
