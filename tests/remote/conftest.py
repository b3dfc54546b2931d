"""Fixtures of the remote tests: two real sshd on 127.0.0.1 in front of the sandbox (tests/remote/test_remote_ssh.py).

``ssh_hosts``: a jump host (key only) and a "login" host that requires a key AND a time-based one-time code (PAM's
pam_oath with a random secret made here), reached through the jump host with ProxyJump from a test ssh config
(``$SHIPYARD_SSH_CONFIG``: ssh -F, so the user's own ~/.ssh is never read or written). The one-time code reaches ssh
only through an askpass helper that computes it (oathtool reading the secret from its stdin): no code or key is in
an argv or a log. The login sshd runs as ``shipyard-otp-sshd`` (a symlink: sshd names its PAM service after its
program name), so its PAM file is its own, removed at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PAM_SERVICE = "shipyard-otp-sshd"


@dataclass
class SshHosts:
    directory: Path
    config: Path  # the test's ssh config (ProxyJump cluster-login -> jump)
    askpass: Path
    login_log: Path
    jump_log: Path
    login_port: int
    jump_port: int

    def env(self, **extra) -> dict[str, str]:
        """The environment of a command "on the laptop": the test ssh config, a private cache dir, askpass."""
        env = dict(os.environ)
        env.update({"SHIPYARD_SSH_CONFIG": str(self.config), "XDG_CACHE_HOME": str(self.directory / "cache"),
                    "SSH_ASKPASS": str(self.askpass), "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"})
        env.update(extra)
        return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    """Until this sshd says it listens on ``port`` (its own log line: a connection to the port could reach another
    process that took it first)."""
    said = f"Server listening on 127.0.0.1 port {port}."
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if proc.poll() is not None:
            raise AssertionError(f"sshd on {port} exited: {text[-2000:]}")
        if said in text:
            return
        time.sleep(0.05)
    raise AssertionError(f"sshd on {port} did not listen within 10 s")


def _start_sshds(d: Path, procs: list[subprocess.Popen], tries: int = 5) -> tuple[int, int]:
    """Start the jump and login sshds (appended to ``procs``, which the caller stops) on free ports; returns (jump
    port, login port). A port found free can be taken by another test's process before sshd binds it: then both
    start again on new ports, up to ``tries`` times."""
    common = (f"ListenAddress 127.0.0.1\nHostKey {d / 'hostkey'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
              f"PidFile none\nStrictModes no\nPasswordAuthentication no\nPermitRootLogin yes\n")
    otp_sshd = d / PAM_SERVICE
    if not otp_sshd.is_symlink():
        otp_sshd.symlink_to("/usr/sbin/sshd")
    for attempt in range(tries):
        jump_port, login_port = _free_port(), _free_port()
        (d / "jump.conf").write_text(common + f"Port {jump_port}\nUsePAM no\nAuthenticationMethods publickey\n"
                                     "KbdInteractiveAuthentication no\nAllowTcpForwarding yes\nLogLevel DEBUG1\n")
        (d / "login.conf").write_text(common + f"Port {login_port}\nUsePAM yes\nKbdInteractiveAuthentication yes\n"
                                      "AuthenticationMethods publickey,keyboard-interactive\nLogLevel VERBOSE\n"
                                      "MaxSessions 64\n")
        started = []
        for binary, conf, log in (("/usr/sbin/sshd", "jump.conf", "jump.log"),
                                  (str(otp_sshd), "login.conf", "login.log")):
            (d / log).unlink(missing_ok=True)
            started.append(subprocess.Popen([binary, "-D", "-f", str(d / conf), "-E", str(d / log)],
                                            stdin=subprocess.DEVNULL))
        procs.extend(started)
        try:
            _wait_port(jump_port, started[0], d / "jump.log")
            _wait_port(login_port, started[1], d / "login.log")
            return jump_port, login_port
        except AssertionError as err:
            if "Address already in use" not in str(err) or attempt == tries - 1:
                raise
            for p in started:
                p.terminate()
                p.wait(10)
                procs.remove(p)
    raise AssertionError(f"sshd: no free pair of ports in {tries} tries")


@pytest.fixture(scope="module")
def ssh_hosts():
    missing = [t for t in ("sshd", "ssh", "oathtool", "rsync")
               if not shutil.which(t) and not Path(f"/usr/sbin/{t}").exists()]
    pam = [p for p in ("/lib/x86_64-linux-gnu/security/pam_oath.so", "/lib/aarch64-linux-gnu/security/pam_oath.so",
                       "/usr/lib/x86_64-linux-gnu/security/pam_oath.so") if Path(p).exists()]
    if os.geteuid() != 0 or missing or not pam:
        pytest.skip(f"needs root, openssh-server, oathtool, rsync and libpam-oath (missing: {missing or 'pam_oath'})")
    d = Path(tempfile.mkdtemp(prefix="sy-ssh-", dir="/tmp"))  # short: a ControlPath socket name has ~100 bytes
    os.chmod(d, 0o700)
    procs: list[subprocess.Popen] = []
    pam_file = Path("/etc/pam.d") / PAM_SERVICE
    try:
        for key in ("hostkey", "id"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
        (d / "authorized_keys").write_text((d / "id.pub").read_text())
        # the TOTP secret: only in a 0600 file root's PAM reads and the askpass helper's stdin
        secret = secrets.token_hex(20)
        users = d / "users.oath"
        users.write_text(f"HOTP/T30/6 root - {secret}\n")
        users.chmod(0o600)
        (d / "otp.secret").write_text(secret)
        (d / "otp.secret").chmod(0o600)
        askpass = d / "askpass"
        askpass.write_text("#!/bin/sh\n# one-time code for the login host's prompt (anything else: no answer)\n"
                           "case \"$1\" in *[Oo]ne-time*|*OATH*|*erification*) "
                           f"exec oathtool --totp - < {d / 'otp.secret'};; esac\nexit 1\n")
        askpass.chmod(0o700)
        pam_file.write_text(f"auth required pam_oath.so usersfile={users} window=3 digits=6\n"
                            "account required pam_permit.so\nsession required pam_permit.so\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        jump_port, login_port = _start_sshds(d, procs)
        hostkey = (d / "hostkey.pub").read_text().split()
        (d / "known_hosts").write_text("".join(f"[127.0.0.1]:{p} {hostkey[0]} {hostkey[1]}\n"
                                               for p in (jump_port, login_port)))
        host = (f"  HostName 127.0.0.1\n  User root\n  IdentityFile {d / 'id'}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
        config = d / "ssh_config"
        config.write_text(f"Host jump\n  Port {jump_port}\n{host}\nHost cluster-login\n  Port {login_port}\n"
                          f"  ProxyJump jump\n{host}")
        yield SshHosts(d, config, askpass, d / "login.log", d / "jump.log", login_port, jump_port)
    finally:
        # a master a failed test left open (remote.login's ControlPersist): closed by its socket, never by name
        for sock in (d / "cache").glob("*/ssh/*"):
            subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=10)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        pam_file.unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)
