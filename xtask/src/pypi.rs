//! Minimal PyPI client for the fetch commands: the JSON API and plain file downloads.

use std::io::Read;

use crate::Result;

/// PyPI's JSON API root.
pub const API: &str = "https://pypi.org/pypi";

/// The JSON API document of `package` (all releases; `info.version` is the newest).
pub fn package_json(package: &str) -> Result<(String, serde_json::Value)> {
    let url = format!("{API}/{package}/json");
    let text = ureq::get(&url)
        .call()
        .map_err(|e| format!("{url}: {e}"))?
        .into_string()
        .map_err(|e| format!("{url}: {e}"))?;
    let meta = serde_json::from_str(&text).map_err(|e| format!("{url}: bad JSON: {e}"))?;
    Ok((url, meta))
}

/// Downloads `url` into memory.
pub fn download(url: &str) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    ureq::get(url)
        .call()
        .map_err(|e| format!("{url}: {e}"))?
        .into_reader()
        .read_to_end(&mut body)
        .map_err(|e| format!("{url}: {e}"))?;
    Ok(body)
}

/// `rel` relative to `base` (an index may list release files by relative URL).
pub fn resolve(base: &str, rel: &str) -> String {
    if rel.contains("://") {
        return rel.to_owned();
    }
    let Some((scheme, rest)) = base.split_once("://") else {
        return rel.to_owned();
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop(); // the document's own name
    for seg in rel.split('/') {
        match seg {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    format!("{scheme}://{host}/{}", parts.join("/"))
}
