//! `control_line`: one line of the control protocol
//! (`RequestEnvelope::parse_line`, what the control socket runs on every
//! line it reads).
//!
//! Input: the line, newline excluded. A refused line must make a reply
//! line; an accepted one must survive its own encoding (`to_line` parses
//! back to the same request).

use cxlfs_api::control::{Reply, Request, RequestEnvelope};
use serde_json::Value;

/// Numbers that may not come back bit for bit through serde_json's text
/// form (floats: its default parser is not always correctly rounded).
fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// Runs one input (see the module's documentation).
///
/// # Panics
/// When the parser panics, when a refusal cannot be encoded as a reply
/// line, or when an accepted request does not parse back from its own line.
///
/// Returns whether the line was accepted.
pub fn run(data: &[u8]) -> bool {
    match RequestEnvelope::parse_line(data) {
        Err(refused) => {
            let line = Reply::failure(refused.id, refused.error).to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            serde_json::from_str::<Value>(&line).expect("a refusal is JSON");
            false
        }
        Ok(env) => {
            let line = env.to_line();
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            let again = RequestEnvelope::parse_line(line.trim_end().as_bytes())
                .unwrap_or_else(|e| panic!("own line {line:?} refused: {e:?}"));
            let floats = match &env.request {
                Request::SetPolicy { params, .. } => params.values().any(has_float),
                _ => false,
            };
            if !floats {
                assert_eq!(again.request, env.request, "line {line:?}");
            }
            if !has_float(&env.id) {
                assert_eq!(again.id, env.id, "line {line:?}");
            }
            if let Some((_, spec)) = env.request.as_range() {
                let _ = spec.target();
            }
            true
        }
    }
}
