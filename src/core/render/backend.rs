//! One backend's section: `parts/backend.j2` rendered as `{% include %}` would render it. A
//! plain function; remembering sections is [`super::section_cache`]'s, joining them into
//! haproxy.cfg [`super::sections`]'.

use minijinja::{Environment, Error, Value};

use super::views::backend_value;
use crate::model::Backend;

/// The template a section is.
const BACKEND_TEMPLATE: &str = "parts/backend.j2";

/// The section of `backend`: `parts/backend.j2` rendered with `model`, `files` and `backend`,
/// what `{% include %}` would see. `model` is what the template may read of the model (in a
/// render, a [`super::views::ModelView`], which notes what is read).
pub(crate) fn render_backend(
    env: &Environment<'_>,
    model: &Value,
    files: &Value,
    backend: &Backend,
) -> Result<String, Error> {
    render_section(env, model, files, backend_value(backend))
}

/// `parts/backend.j2` rendered with `model`, `files` and `backend`.
pub(super) fn render_section(
    env: &Environment<'_>,
    model: &Value,
    files: &Value,
    backend: Value,
) -> Result<String, Error> {
    let ctx = minijinja::context! {
        model => model.clone(),
        files => files.clone(),
        backend => backend,
    };
    env.get_template(BACKEND_TEMPLATE)?.render(ctx)
}
