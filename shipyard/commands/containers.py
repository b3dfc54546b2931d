"""`invoke build`, `push`, `pull`, `sign` and `verify`: images in ``containers/``, made, published, fetched, signed.

The command resolves the environment once, runs the check gate where the work reads the definition (build: the
lock included, so a refused environment never starts a 30-minute build), and hands the objects to
:mod:`shipyard.containers`.
"""

from __future__ import annotations

from pathlib import Path

from shipyard import project
from shipyard.commands import remote as remote_commands
from shipyard.commands.context import Context
from shipyard.containers import contents, engine, on_slurm, push as registry_io, sign as signing
from shipyard.containers import manifest as mf
from shipyard.errors import ShipyardError
from shipyard.remote import transport
from shipyard.staging import kept_contents
from shipyard.staging import record as staged_record
from shipyard.staging import stage as staging


def build(ctx: Context, env: str | None = None, *, backend: str | None = None, fakeroot: bool = False,
          force: bool = False, formats: str | None = None, block: bool = True, slurm: bool = False,
          cluster: str | None = None, partition: str | None = None, wait: bool = False,
          verify_rebuild: bool = False) -> int:
    """`invoke build`: locally, or as a batch job on a cluster's build partition with ``slurm``. With
    ``verify_rebuild``: build again from the same inputs and compare the two contents records (:func:`rebuild_verdict`)."""
    environment = ctx.environment(env)
    if verify_rebuild:
        if slurm:
            raise ShipyardError("--verify-rebuild builds here (it compares this machine's two builds); drop --slurm")
        return _verify_rebuild(ctx, environment, backend=backend, fakeroot=fakeroot, force=force, formats=formats,
                               block=block)
    if slurm and transport.is_remote(ctx.cluster(cluster)):  # the build job writes to the cluster's storage
        return remote_commands.forward(ctx, ctx.cluster(cluster))
    forced = ctx.gate(environment, what=f"build {environment.name}", force=force, locks=True)
    if slurm:
        return on_slurm.submit(ctx.registry, environment.name, cluster_name=cluster or None,
                               partition=partition or None, backend=backend or None, fakeroot=fakeroot, force=force,
                               formats=formats, wait=wait, out=ctx.out)
    if wait or partition or cluster:
        raise ShipyardError("--wait, --partition and --cluster only apply with --slurm")
    engine.build(ctx.registry, environment, backend=backend or "apptainer", fakeroot=fakeroot, force=force, formats=formats,
                 block=block, out=ctx.out, forced=forced)
    return 0


def push(ctx: Context, env: str | None = None, registry: str | None = None, tag: str | None = None) -> int:
    """`invoke push`."""
    registry_io.push(ctx.registry, ctx.environment(env), registry or None, tag or None, out=ctx.out)
    return 0


def pull(ctx: Context, env: str | None = None, registry: str | None = None, tag: str | None = None,
         force: bool = False) -> int:
    """`invoke pull`."""
    registry_io.pull(ctx.registry, ctx.environment(env), registry or None, tag or None, out=ctx.out, force=force)
    return 0


def sign(ctx: Context, env: str | None = None, keyidx: int = 0) -> int:
    """`invoke sign`."""
    sig = signing.sign(ctx.registry, ctx.environment(env), keyidx)
    new = sig["signers"][-1]
    ctx.say(f"signed with {new['fingerprint']} ({new['signer']}); recorded in the build manifest "
            f"({len(sig['signers'])} signature(s) of this image)")
    return 0


def verify(ctx: Context, env: str | None = None) -> int:
    """`invoke verify`: exit 1 (one line) unless the image verifies and every key `invoke sign` recorded signed it."""
    res = signing.verify(ctx.registry, ctx.environment(env))
    ctx.say(f"verified: signed by {signing.describe_signers(res['signers'])}")
    return 0


def _manifest(ctx: Context, env_name: str) -> tuple[Path, mf.Manifest]:
    path = project.manifest_path(ctx.registry, env_name)
    return path, mf.read_manifest(path)


def _verify_rebuild(ctx: Context, environment, *, backend, fakeroot, force, formats, block) -> int:
    """Build (when needed), then build again with the same lock and definition, and compare what the two images
    hold. Exit 1 on a Python difference (the lock pins every wheel by hash: it must never happen); apt drift and
    changed libraries or labels are reported, not failed."""
    forced = ctx.gate(environment, what=f"build {environment.name}", force=force, locks=True)
    kwargs = dict(backend=backend or "apptainer", fakeroot=fakeroot, formats=formats, block=block, out=ctx.out,
                  forced=forced)
    first = engine.build(ctx.registry, environment, force=False, **kwargs)
    if first.contents_record is None:  # built by a shipyard that did not record contents, or the probe failed
        first = engine.build(ctx.registry, environment, force=True, **kwargs)
    second = engine.build(ctx.registry, environment, force=True, **kwargs)
    old, new = first.contents_record, second.contents_record
    if old is None or new is None:
        raise ShipyardError(f"{project.manifest_path(ctx.registry, environment.name)}: a build of "
                            f"{environment.name} recorded no contents (its log says why); nothing to compare")
    text, code = rebuild_verdict(environment.name, old, new)
    ctx.write(text)
    return code


def rebuild_verdict(env_name: str, old: contents.Contents, new: contents.Contents) -> tuple[str, int]:
    """The text and exit code of `invoke build ENV --verify-rebuild`: 1 when a Python package differs, else 0;
    apt packages are named as apt drift (apt floats between builds; the lock pins only the Python closure)."""
    changes = contents.diff(old, new)
    python = [c for c in changes if c.section == "python"]
    apt = [c for c in changes if c.section == "apt"]
    lines = [contents.render_diff(changes, f"{env_name}: the first build", f"{env_name}: the rebuild").rstrip("\n")]
    if apt:
        lines.append(f"apt drift: {len(apt)} apt package(s) differ between two builds of the same lock "
                     "(apt sources float; the Python closure is what the lock pins)")
    if python:
        names = ", ".join(c.name for c in python[:5]) + (" ..." if len(python) > 5 else "")
        lines.append(f"ERROR: {len(python)} Python package(s) differ between two builds of the same lock ({names}): "
                     "the image is not reproducible from its lock")
    else:
        lines.append("Python packages: identical in both builds")
    return "\n".join(lines) + "\n", 1 if python else 0


def _last_contents(ctx: Context, env_name: str):
    """ENV's build manifest's path, the manifest and the contents record of its last build; one line when it has
    none."""
    path, m = _manifest(ctx, env_name)
    if m.contents_record is None:
        raise ShipyardError(f"{path}: no contents recorded for {env_name}; build it with this shipyard "
                            f"(`invoke build {env_name}`) first")
    return path, m, m.contents_record


def show_contents(ctx: Context, env: str | None = None) -> int:
    """`invoke show ENV --contents`: the contents record of ENV's last build."""
    environment = ctx.environment(env)
    _, m, rec = _last_contents(ctx, environment.name)
    ctx.write(contents.render(rec, f"{environment.name}: the image built {m.finished or '?'} "
                                   f"(input hash {(m.input_hash or '?')[:12]})"))
    return 0


def diff(ctx: Context, env: str | None = None, against: str | None = None, staged: list[str] | tuple | None = (),
         cluster: str | None = None) -> int:
    """`invoke diff ENV [--against MANIFEST | --staged V [--staged V2]] [--cluster C]`: what changed between two
    images' contents records: the build before and the last build of ENV; another build manifest (a kept copy of
    containers/ENV.json) and the last build; a staged version (``current``, its file name or a sha256 prefix, on the
    cluster's storage) and the last build; or two staged versions, the first as the old one."""
    environment = ctx.environment(env)
    if staged:
        if against:
            raise ShipyardError("--against and --staged: give one of them (--staged V --staged V2 compares two staged "
                                "versions)")
        if len(staged) > 2:
            raise ShipyardError(f"--staged given {len(staged)} times: once (that version against the last build) or "
                                "twice (two staged versions)")
        where = ctx.cluster(cluster)
        if transport.is_remote(where):  # the staged versions live on the cluster's storage
            return remote_commands.forward(ctx, where)
        dest = Path(staging.request(where)[0].image(ctx.registry.root, environment.name, where))
        sides = [_staged_side(dest, name, environment.name, where.name) for name in staged]
        if len(sides) == 1:
            _, m, new = _last_contents(ctx, environment.name)
            sides.append((new, f"{environment.name}: the last build ({m.finished or '?'}, input hash "
                               f"{(m.input_hash or '?')[:12]})"))
        (old, old_title), (new, new_title) = sides
        ctx.write(contents.render_diff(contents.diff(old, new), old_title, new_title))
        return 0
    path, m, new = _last_contents(ctx, environment.name)
    if against:
        other_path = Path(against)
        if not other_path.is_file():
            raise ShipyardError(f"--against {against}: no such build manifest (a containers/ENV.json of another "
                                "build)")
        other = mf.read_manifest(other_path)
        old = other.contents_record
        old_title = f"{against} (built {other.finished or '?'}, input hash {(other.input_hash or '?')[:12]})"
        if old is None:
            raise ShipyardError(f"--against {against}: that manifest records no contents (a build by a shipyard "
                                "that did not record them)")
    else:
        old = m.previous_contents_record
        old_title = f"{environment.name}: the build before the last"
        if old is None:
            raise ShipyardError(f"{path}: no earlier build of {environment.name} recorded its contents; build "
                                f"again (`invoke build {environment.name} --force`) or pass --against MANIFEST")
    new_title = f"{environment.name}: the last build ({m.finished or '?'}, input hash {(m.input_hash or '?')[:12]})"
    ctx.write(contents.render_diff(contents.diff(old, new), old_title, new_title))
    return 0


def _staged_side(dest: Path, name: str, env_name: str, cluster_name: str):
    """(the contents kept with the staged version ``name``, its title); one line when it kept none."""
    version = kept_contents.find(dest, name)
    rec = kept_contents.read(version)
    if rec is None:
        raise ShipyardError(f"--staged {name}: {version} has no contents record beside it "
                            f"({kept_contents.path(version).name}): it was staged from a registry, or by a shipyard "
                            "that kept none; stage a build of this shipyard from containers/ to keep one")
    when, _ = staged_record.read_record(version)
    return rec, (f"{env_name}: staged version {version.name} on {cluster_name}"
                 + (f" (staged {when.staged}, input hash {(when.input_hash or '?')[:12]})" if when else ""))
