"""Every output is a regular file: symlinks are written through (the link stays), fifos, sockets and
devices are refused and left alone, and an output that cannot be written is refused before the work."""

import os
import socket
import stat

import pytest
from typer.testing import CliRunner

import duocal_runtime as dr
from duocal.cli import app
from duocal_runtime.files.atomic import write_atomic
from duocal_runtime.files.output_paths import check_output

from helpers.profiles import random_profile

runner = CliRunner()


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and link.resolve() == target and target.read_text() == "new"


def test_fifos_and_sockets_are_refused_and_left_as_they_are(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        for path, kind in ((fifo, "a fifo"), (sock_path, "a socket")):
            with pytest.raises(ValueError, match=f"is {kind}, not a regular file"):
                write_atomic(path, "data")
            with pytest.raises(ValueError, match=f"is {kind}"):
                check_output(path, "--output")
        link = tmp_path / "to-fifo"
        link.symlink_to(fifo)
        with pytest.raises(ValueError, match="is a fifo"):
            write_atomic(link, "data")
        assert stat.S_ISFIFO(fifo.stat().st_mode) and stat.S_ISSOCK(sock_path.stat().st_mode) and link.is_symlink()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "sock", "to-fifo"]  # no temp file left
    finally:
        server.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root (CI runs as root)")
def test_a_device_node_is_never_replaced(tmp_path):
    device = tmp_path / "null"
    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null, in the test's folder
    result = runner.invoke(app, ["profiles", "import-upstream", str(tmp_path), "-o", str(device)])
    assert result.exit_code == 1
    with pytest.raises(ValueError, match="is a character device"):
        dr.save_profile(random_profile(), device)
    assert stat.S_ISCHR(device.stat().st_mode)


def test_a_name_of_255_characters_is_written(tmp_path):
    path = tmp_path / ("p" * 250 + ".json")
    profile = random_profile()
    dr.save_profile(profile, path)
    assert dr.load_profile(str(path)).to_dict() == profile.to_dict()


def test_an_unwritable_output_is_refused_before_the_measurement(tmp_path, monkeypatch):
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    monkeypatch.setattr("duocal.models.resolve.ModelRef.load_model", lambda *a: pytest.fail("measured first"))
    try:
        if os.access(readonly, os.W_OK):  # root writes anywhere: a file in place of the folder instead
            readonly.chmod(0o700)
            readonly.rmdir()
            readonly.write_text("")
        result = runner.invoke(app, ["profile", "--output", str(readonly / "p.json"), "--samples", "1"])
        assert result.exit_code == 1 and result.stderr.startswith("error: ")
        assert str(readonly) in result.stderr and ".tmp" not in result.stderr
        plot = runner.invoke(app, ["eval", "passkey", "--plot", str(readonly / "x.png"), "--samples", "1"])
        assert plot.exit_code == 1 and str(readonly) in plot.stderr
    finally:
        if readonly.is_dir():
            readonly.chmod(0o700)
