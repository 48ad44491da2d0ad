//! The log of the paths an agent served, which the next agent on the same keeper connection
//! reads to invalidate what the kernel may still cache of them.

use std::io;
use std::path::Path;

use crate::tree::Tree;

/// Writes the paths of `tree` to `file`, one per line, replacing it whole: what the next agent
/// on the same connection gives [`super::TreeHandle::forget`].
pub(crate) fn record_paths(tree: &Tree, file: &Path) -> io::Result<()> {
    let text: String = tree
        .iter()
        .filter(|(path, _)| !path.is_empty())
        .flat_map(|(path, _)| [path, "\n"])
        .collect();
    let tmp = file.with_extension("new");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)
}

/// The paths [`record_paths`] wrote to `file`; none when there is no such file.
pub(crate) fn recorded_paths(file: &Path) -> io::Result<Vec<String>> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text.lines().map(str::to_owned).collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}
