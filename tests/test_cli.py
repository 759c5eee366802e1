import subprocess
import sys
from pathlib import Path

from draftgate.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_exits_2_naming_the_choices(capsys):
    assert main(["frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "frobnicate" in err and "validate" in err


def test_help_does_not_import_heavy_libraries():
    # `draftgate --help` must stay fast: torch, transformers, GX and pandas load only when used.
    code = (
        "import sys; from draftgate.cli import main; main(['--help']);"
        "heavy = [m for m in ('torch', 'transformers', 'great_expectations', 'pandas', 'pyarrow')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_validate_names_the_available_suites_when_the_suite_is_unknown(capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert main(["validate", "tokns", "data/tokens/tokens.parquet", "--no-docs"]) == 2
    err = capsys.readouterr().err
    assert ("available suites: composition, contract, drafter, eval, hidden, prompts, repair, responses, template, "
            "tokens") in err
