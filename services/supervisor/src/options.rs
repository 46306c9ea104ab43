//! Which of an agent's ACP session config options carries a caller's model or effort request, and
//! with which value (pure; a leaf).
//!
//! A caller may ask for a model and an effort (`OpenConversationRequest.model` / `.effort`). They
//! are applied with `session/set_config_option` on the option the agent itself offered in its
//! `session/new` answer, and only with a value from that option's list: a value the agent never
//! offered is refused before the first prompt (never passed through for the agent to interpret,
//! never replaced by a default).
//!
//! Must never: choose an option of category `mode` (the supervised mode is the supervisor's to
//! force, never a caller's to pick), or accept a value the agent did not list.

use serde_json::Value;

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    Model,
    Effort,
}

impl Wanted {
    pub fn as_str(self) -> &'static str {
        match self {
            Wanted::Model => "model",
            Wanted::Effort => "effort",
        }
    }

    /// The ACP category of the option, and the option ids that mean it when an agent gives no
    /// category.
    fn matches(self, category: Option<&str>, id: &str) -> bool {
        match (self, category) {
            (_, Some("mode")) => false,
            (Wanted::Model, Some(c)) => c == "model",
            (Wanted::Effort, Some(c)) => c == "thought_level",
            (Wanted::Model, None) => id == "model",
            (Wanted::Effort, None) => {
                matches!(id, "thought_level" | "reasoning_effort" | "effort")
            }
        }
    }
}

/// The option and value to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub config_id: String,
    pub value: String,
    /// Already the option's current value: nothing to set.
    pub current: bool,
}

/// Why a request cannot be applied; the text is for the caller and names what was offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotOffered {
    #[error("the agent offers no {0} choice (no session config option of that category)")]
    NoOption(&'static str),
    #[error("the agent does not offer the {what} {wanted:?}; it offers: {offered}")]
    NoValue {
        what: &'static str,
        wanted: String,
        offered: String,
    },
}

/// Picks the option and value for `wanted` (matched against each value, or case-insensitively
/// against its display name) from the agent's `configOptions` list. Grouped select options
/// (`options: [{group, options: [...]}]`) are searched too.
pub fn choose(options: &Value, which: Wanted, wanted: &str) -> Result<Choice, NotOffered> {
    let opt = options
        .as_array()
        .into_iter()
        .flatten()
        .find(|o| {
            let id = o.get("id").and_then(Value::as_str).unwrap_or("");
            !id.is_empty() && which.matches(o.get("category").and_then(Value::as_str), id)
        })
        .ok_or(NotOffered::NoOption(which.as_str()))?;
    let config_id = opt
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let values = values_of(opt);
    let hit = values
        .iter()
        .find(|(v, _)| v == wanted)
        .or_else(|| values.iter().find(|(_, n)| n.eq_ignore_ascii_case(wanted)));
    match hit {
        Some((value, _)) => Ok(Choice {
            current: opt.get("currentValue").and_then(Value::as_str) == Some(value.as_str()),
            config_id,
            value: value.clone(),
        }),
        None => Err(NotOffered::NoValue {
            what: which.as_str(),
            wanted: wanted.to_string(),
            offered: if values.is_empty() {
                "nothing".into()
            } else {
                values
                    .iter()
                    .map(|(v, _)| v.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        }),
    }
}

/// The (value, name) pairs of a select option, flattening groups.
fn values_of(opt: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for o in opt
        .get("options")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(inner) = o.get("options").and_then(Value::as_array) {
            out.extend(inner.iter().filter_map(pair));
        } else if let Some(p) = pair(o) {
            out.push(p);
        }
    }
    out
}

fn pair(o: &Value) -> Option<(String, String)> {
    let v = o.get("value").and_then(Value::as_str)?;
    let n = o.get("name").and_then(Value::as_str).unwrap_or(v);
    Some((v.to_string(), n.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts() -> Value {
        json!([
            {"id": "mode", "category": "mode", "type": "select", "currentValue": "default",
             "options": [{"value": "default", "name": "Manual"}, {"value": "bypassPermissions", "name": "Bypass"}]},
            {"id": "model", "category": "model", "type": "select", "currentValue": "sonnet",
             "options": [{"value": "sonnet", "name": "Sonnet"}, {"value": "opus", "name": "Opus 4"}]},
            {"id": "reasoning", "category": "thought_level", "type": "select", "currentValue": "medium",
             "options": [{"group": "g", "name": "G", "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}]}]}
        ])
    }

    #[test]
    fn a_value_the_agent_offered_is_chosen_by_value_or_name() {
        let c = choose(&opts(), Wanted::Model, "opus").unwrap();
        assert_eq!(
            (c.config_id.as_str(), c.value.as_str(), c.current),
            ("model", "opus", false)
        );
        let c = choose(&opts(), Wanted::Model, "opus 4").unwrap();
        assert_eq!(c.value, "opus");
        assert!(choose(&opts(), Wanted::Model, "sonnet").unwrap().current);
        let c = choose(&opts(), Wanted::Effort, "high").unwrap();
        assert_eq!(
            (c.config_id.as_str(), c.value.as_str()),
            ("reasoning", "high")
        );
    }

    #[test]
    fn a_value_never_offered_is_refused_naming_what_is() {
        let e = choose(&opts(), Wanted::Model, "gpt-9").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the agent does not offer the model \"gpt-9\"; it offers: sonnet, opus"
        );
        assert!(matches!(
            choose(&opts(), Wanted::Effort, "xhigh"),
            Err(NotOffered::NoValue { .. })
        ));
    }

    #[test]
    fn the_mode_option_is_never_a_model_or_effort_even_when_named_so() {
        // A hostile agent names its mode option "model": the category says what it is.
        let o = json!([{"id": "model", "category": "mode", "options": [{"value": "bypassPermissions"}]}]);
        assert_eq!(
            choose(&o, Wanted::Model, "bypassPermissions"),
            Err(NotOffered::NoOption("model"))
        );
        assert_eq!(
            choose(&opts(), Wanted::Model, "bypassPermissions").unwrap_err(),
            NotOffered::NoValue {
                what: "model",
                wanted: "bypassPermissions".into(),
                offered: "sonnet, opus".into()
            }
        );
    }

    #[test]
    fn without_categories_the_ids_say_it_and_without_options_nothing_is_offered() {
        let o = json!([{"id": "reasoning_effort", "options": [{"value": "low"}]}, {"id": "model", "options": []}]);
        assert_eq!(
            choose(&o, Wanted::Effort, "low").unwrap().config_id,
            "reasoning_effort"
        );
        assert!(
            matches!(choose(&o, Wanted::Model, "x"), Err(NotOffered::NoValue { offered, .. }) if offered == "nothing")
        );
        assert_eq!(
            choose(&Value::Null, Wanted::Model, "x"),
            Err(NotOffered::NoOption("model"))
        );
        assert_eq!(
            choose(&json!({"id": "model"}), Wanted::Model, "x"),
            Err(NotOffered::NoOption("model"))
        );
    }
}
