"""The one way batchscale writes HTML: jinja2 templates from `batchscale/templates/`, with
autoescaping on and the shared stylesheet inlined (pages open from a file or the KFP UI, with
nothing fetched from the network).

Every page extends `base.html.j2`, which takes `title` and a `body` block. Pass values, not
markup; a value that is already safe HTML (a rendered plot `<figure>`, Markdown turned into
HTML by `markdown_html`) is wrapped in `markupsafe.Markup` by the caller that made it.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import jinja2
from markupsafe import Markup

TEMPLATES_PACKAGE = "batchscale"
TEMPLATES_FOLDER = "templates"
STYLESHEET = "style.css"


@cache
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader(TEMPLATES_PACKAGE, TEMPLATES_FOLDER),
        autoescape=True,  # every page: user-supplied names and error text end up in them
        undefined=jinja2.StrictUndefined,  # a misspelt variable fails the render, not the page
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


@cache
def stylesheet() -> Markup:
    text = resources.files(TEMPLATES_PACKAGE).joinpath(TEMPLATES_FOLDER, STYLESHEET).read_text()
    return Markup(text)


def render_page(template: str, *, title: str, **context: object) -> str:
    """Render `template` (which extends base.html.j2) into a whole HTML page."""
    return environment().get_template(template).render(
        title=title, stylesheet=stylesheet(), **context)


def markdown_html(text: str) -> Markup:
    """Markdown (the prose the analysis also gives KFP's Markdown artifact) as safe HTML. Raw HTML
    in the text is escaped, not passed through: the text carries user-supplied names."""
    import mistune

    return Markup(mistune.create_markdown(escape=True, plugins=["table"])(text))
