//! `{name}` templates in phase commands: a spec's `vars` (sweepable as
//! `vars.NAME`), the run's own figures (`cache_bytes`, `cxl_memory_bytes`,
//! `vm`, `vm_index`, `vms`) and products or quotients of them
//! (`{wss_over_cache*cache_bytes}`), floored with `int:`
//! (`{int:dataset*cache_bytes/1100}`).
//!
//! Only a brace pair whose inside looks like such an expression is a
//! template; shell (`${VAR}`) and awk (`{ print $1 }`) braces stay as they
//! are. `{{` and `}}` are literal braces.

use std::collections::BTreeMap;

/// A variable's value.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateValue {
    /// A number (products and quotients allowed).
    Number(f64),
    /// Text (only on its own: `{vm}`).
    Text(String),
}

impl TemplateValue {
    /// From a spec value: integers and floats are numbers, strings text,
    /// anything else its TOML text.
    pub fn of_toml(v: &toml::Value) -> TemplateValue {
        match v {
            toml::Value::Integer(i) => TemplateValue::Number(*i as f64),
            toml::Value::Float(f) => TemplateValue::Number(*f),
            toml::Value::String(s) => TemplateValue::Text(s.clone()),
            other => TemplateValue::Text(other.to_string()),
        }
    }
}

/// Why a template does not render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderTemplateError {
    /// A name that is neither a variable nor a number.
    #[error("`{{{expr}}}`: no variable `{name}` (known: {known}; `{{{{` is a literal brace)")]
    Unknown {
        /// The whole expression.
        expr: String,
        /// The name.
        name: String,
        /// The names there are.
        known: String,
    },
    /// Text in a product, a division by zero, a result that is not finite.
    #[error("`{{{expr}}}`: {why}")]
    Arithmetic {
        /// The whole expression.
        expr: String,
        /// What went wrong.
        why: String,
    },
}

/// Whether `inside` (between braces) is meant as an expression.
fn is_expression(inside: &str) -> bool {
    let inside = inside.strip_prefix("int:").unwrap_or(inside);
    let mut chars = inside.chars();
    let starts_like_a_name = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    starts_like_a_name
        && inside
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.*/".contains(c))
}

/// A number as a command expects it: integral values without a fraction.
pub fn number_text(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

fn evaluate(
    expr: &str,
    vars: &BTreeMap<String, TemplateValue>,
) -> Result<String, RenderTemplateError> {
    if let Some(inner) = expr.strip_prefix("int:") {
        let text = evaluate(inner, vars)?;
        return match text.parse::<f64>() {
            Ok(x) => Ok(number_text(x.floor())),
            Err(_) => Err(RenderTemplateError::Arithmetic {
                expr: expr.to_string(),
                why: format!("`{text}` is not a number"),
            }),
        };
    }
    let unknown = |name: &str| RenderTemplateError::Unknown {
        expr: expr.to_string(),
        name: name.to_string(),
        known: vars.keys().cloned().collect::<Vec<_>>().join(", "),
    };
    let arith = |why: String| RenderTemplateError::Arithmetic {
        expr: expr.to_string(),
        why,
    };
    if !expr.contains(['*', '/']) {
        return match vars.get(expr) {
            Some(TemplateValue::Number(x)) => Ok(number_text(*x)),
            Some(TemplateValue::Text(t)) => Ok(t.clone()),
            None => Err(unknown(expr)),
        };
    }
    let mut acc = 1.0_f64;
    let mut op = '*';
    let mut rest = expr;
    loop {
        let end = rest.find(['*', '/']).unwrap_or(rest.len());
        let term = &rest[..end];
        let x = match term.parse::<f64>() {
            Ok(x) => x,
            Err(_) => match vars.get(term) {
                Some(TemplateValue::Number(x)) => *x,
                Some(TemplateValue::Text(t)) => {
                    return Err(arith(format!("`{term}` is text (`{t}`), not a number")))
                }
                None => return Err(unknown(term)),
            },
        };
        if op == '*' {
            acc *= x;
        } else if x == 0.0 {
            return Err(arith(format!("division by zero (`{term}`)")));
        } else {
            acc /= x;
        }
        if end == rest.len() {
            break;
        }
        op = rest[end..].chars().next().unwrap_or('*');
        rest = &rest[end + 1..];
    }
    if !acc.is_finite() {
        return Err(arith("the result is not finite".into()));
    }
    Ok(number_text(acc))
}

/// Renders `text`, replacing every `{expr}`.
pub fn render(
    text: &str,
    vars: &BTreeMap<String, TemplateValue>,
) -> Result<String, RenderTemplateError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("{{") || tail.starts_with("}}") {
            out.push_str(&tail[..1]);
            rest = &tail[2..];
            continue;
        }
        if tail.starts_with('{') && !out.ends_with('$') {
            if let Some(close) = tail.find('}') {
                let inside = &tail[1..close];
                if is_expression(inside) {
                    out.push_str(&evaluate(inside, vars)?);
                    rest = &tail[close + 1..];
                    continue;
                }
            }
        }
        out.push_str(&tail[..1]);
        rest = &tail[1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vars() -> BTreeMap<String, TemplateValue> {
        [
            ("cache_bytes", TemplateValue::Number(8_388_608.0)),
            ("wss", TemplateValue::Number(1.7)),
            ("vm", TemplateValue::Text("vm0".into())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn expressions_are_replaced_and_shell_braces_kept() {
        let r = render(
            "x --size {wss*cache_bytes} --half {cache_bytes/2} {vm} ${HOME} awk '{ print $1 }' {{vm}}",
            &vars(),
        )
        .unwrap();
        assert_eq!(
            r,
            "x --size 14260633.6 --half 4194304 vm0 ${HOME} awk '{ print $1 }' {vm}"
        );
        assert_eq!(render("{cache_bytes*0.25}", &vars()).unwrap(), "2097152");
        assert_eq!(
            render("{int:wss*cache_bytes/1000}", &vars()).unwrap(),
            "14260"
        );
    }

    #[test]
    fn unknown_names_and_bad_arithmetic_are_errors() {
        let e = render("--size {nope*2}", &vars()).unwrap_err();
        assert!(e.to_string().contains("no variable `nope`"), "{e}");
        assert!(render("{vm*2}", &vars()).is_err());
        assert!(render("{cache_bytes/0}", &vars()).is_err());
    }
}
