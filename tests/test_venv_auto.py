"""``venv: auto`` of a cluster profile: the sweep's jobs find the Python prefix by the path the user reached
it by."""

from __future__ import annotations

from pathlib import Path


def test_venv_auto_keeps_the_path_the_user_activated(tmp_path, monkeypatch):
    """``venv: auto`` renders VIRTUAL_ENV as the user reached it (a link to this prefix), not the resolved
    target that a console script's ``#!`` line names; an unrelated VIRTUAL_ENV (or none): this Python's
    prefix."""
    import sys

    from wagma_bench.campaign.sweep import setup_lines
    from wagma_bench.config.cluster import load_profile

    link = tmp_path / "my-venv"
    link.symlink_to(Path(sys.prefix).resolve())
    profile = load_profile("generic8")
    assert profile.venv == "auto"
    monkeypatch.setenv("VIRTUAL_ENV", str(link))
    assert setup_lines(profile)[-1].startswith(f"export PATH={link}/bin:$PATH")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path))
    assert setup_lines(profile)[-1].startswith(f"export PATH={sys.prefix}/bin:$PATH")
    monkeypatch.delenv("VIRTUAL_ENV")
    assert setup_lines(profile)[-1].startswith(f"export PATH={sys.prefix}/bin:$PATH")
