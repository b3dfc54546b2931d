"""The Jinja2 environments that render the templates sitting with each stage (``shipyard/<stage>/templates/``).

Every generated artifact is a template file rendered from the model. All renderers want the same safety settings:
an undefined name is an error (StrictUndefined), never an empty string in a script; no HTML autoescaping; the
trailing newline kept, so output is byte-stable. The escaping rules of :mod:`shipyard.escaping` are the filters of
every template (:data:`FILTERS`), so a template can only quote a value the one way its file's
syntax needs. A render is a function of its template and its context alone: Jinja2's one global that is not
(``lipsum``, random text) is removed, which :mod:`shipyard.rendered` relies on.

Templates compile once per process (Jinja2 keeps each compiled template in the environment's memory). Across
processes, a template's compiled code is kept where Python keeps the package's own bytecode (:mod:`shipyard.pycache`
says why that folder is safe); Jinja2 checks it against the template's source (a checksum, not a time).
"""

from __future__ import annotations

import functools
import shlex

import jinja2

from shipyard import escaping, pycache

FILTERS = {
    "q": escaping.shell_quote,
    "words": escaping.shell_join,
    "shquote": shlex.quote,
    "envquote": escaping.env_value,
    "dockerquote": escaping.docker_quote,
    "dockerenv": escaping.docker_env,
    "lua": escaping.lua_string,
    "luacomment": escaping.lua_comment,
    "comment": escaping.comment_line,
    "defline": escaping.def_line,
    "defword": escaping.def_word,
    "defpath": escaping.def_path,
    "defenv": escaping.env_line,
    "buildarg": escaping.build_arg_value,
    "dockerkey": escaping.docker_key,
    "dockerline": escaping.docker_line,
    "dockerenvline": escaping.docker_env_line,
    "sbatch": escaping.sbatch_value,
}


class PackageBytecodeCache(jinja2.BytecodeCache):
    """Compiled templates of one package in that package's ``__pycache__`` (:mod:`shipyard.pycache`).

    Each file's name holds the template's key, the environment's settings that change the compiled code and the
    Jinja2 version; its content carries Jinja2's checksum of the source, so an edited template compiles anew.
    """

    def __init__(self, package: str, variant: str):
        self.package = package
        self.variant = f"{variant}-jinja2-{jinja2.__version__}"

    def _name(self, bucket: jinja2.bccache.Bucket) -> str:
        return f"{bucket.key}.{self.variant}.jinja2"

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        data = pycache.read(self.package, self._name(bucket))
        if data is not None:
            bucket.bytecode_from_string(data)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        pycache.write(self.package, self._name(bucket), bucket.bytecode_to_string())


@functools.lru_cache(maxsize=None)
def template_environment(package: str, trim_blocks: bool = False) -> jinja2.Environment:
    """The Jinja2 environment for the templates of ``package`` (e.g. ``"shipyard.launch"``), built once.

    Building it parses nothing until a template is asked for.
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "templates"),
        bytecode_cache=PackageBytecodeCache(package, "trim" if trim_blocks else "keep"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        trim_blocks=trim_blocks,
        lstrip_blocks=trim_blocks,
    )
    env.filters.update(FILTERS)
    env.globals.pop("lipsum", None)
    return env


def render(package: str, template: str, trim_blocks: bool, context: dict) -> str:
    """Render ``<package>/templates/<template>`` with ``context``."""
    return template_environment(package, trim_blocks).get_template(template).render(**context)
