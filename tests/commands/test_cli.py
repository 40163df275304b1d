"""The `sloscope` command as a shell uses it: output cut short by the reader is no error worth a traceback."""

import fcntl
import subprocess
import sys


def test_a_reader_that_stops_early_gets_no_traceback():
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "clickhouse-columns"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    fcntl.fcntl(proc.stdout, fcntl.F_SETPIPE_SZ, 4096)  # smaller than the output: it cannot all be written ahead
    assert proc.stdout.readline().startswith(b"-- ")  # then the reader goes, as `| head -1` does
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in stderr, stderr


def test_a_probe_whose_reader_stops_early_ends_as_every_command_does():
    proc = subprocess.Popen([sys.executable, "-m", "sloscope.commands.cli", "probe", "pressure", "--duration", "30",
                             "--interval", "0.2", "--format", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().startswith(b"{")
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in stderr, stderr


def test_the_command_table_names_each_command_where_it_is_registered():
    """`sloscope X` loads only COMMANDS[X]: the table must say what the modules register."""
    import argparse
    import importlib

    from sloscope.commands.cli import COMMANDS

    registered = {}
    for module in set(COMMANDS.values()):
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(subparsers)
        registered.update(dict.fromkeys(subparsers.choices, module))
    assert registered == COMMANDS
