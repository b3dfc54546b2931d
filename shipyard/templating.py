"""One way to render the templates that sit with each stage (``shipyard/<stage>/templates/``).

Jinja2 renders (:mod:`shipyard.jinja_environment`: the settings and the escaping filters every template gets),
loaded only when a render needs it; a render whose context is plain data is kept by a key of everything it reads
(:mod:`shipyard.rendered`), so that rendering the same definitions again loads no Jinja2 at all.
"""

from __future__ import annotations

from shipyard import rendered


def render(package: str, template: str, trim_blocks: bool = False, **context) -> str:
    """Render ``<package>/templates/<template>`` with ``context``: the kept text when the same render ran before."""
    key = rendered.key(package, template, trim_blocks, context)
    text = rendered.get(package, key) if key else None
    if text is None:
        from shipyard import jinja_environment  # lazy: Jinja2 costs more to import than a command's own work

        text = jinja_environment.render(package, template, trim_blocks, context)
        if key:
            rendered.put(package, key, text)
    return text
