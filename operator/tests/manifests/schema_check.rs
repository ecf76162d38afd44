//! A structural validator for the OpenAPI v3 subset our CRDs use: types, nullable, required,
//! unknown fields, enums, patterns, lengths, ranges, int-or-string (each validation on its own
//! JSON type) and anyOf. Unlike the API server it reports unknown fields instead of pruning
//! them, so typos in samples fail.

use serde_json::Value;

pub fn validate(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != Value::Bool(true) {
            errors.push(format!("{path}: null is not allowed"));
        }
        return;
    }
    if let Some(options) = schema["anyOf"].as_array() {
        let any_ok = options.iter().any(|option| {
            let mut scratch = Vec::new();
            validate(value, option, path, &mut scratch);
            scratch.is_empty()
        });
        if !any_ok {
            errors.push(format!("{path}: matches none of anyOf"));
        }
    }
    let int_or_string = schema["x-kubernetes-int-or-string"] == Value::Bool(true);
    if int_or_string && !(value.is_i64() || value.is_u64() || value.is_string()) {
        errors.push(format!("{path}: expected an integer or a string"));
        return;
    }
    match schema["type"].as_str() {
        Some("object") => check_object(value, schema, path, errors),
        Some("array") => check_array(value, schema, path, errors),
        Some("string") => check_string(value, schema, path, errors),
        Some("integer") => check_number(value, schema, path, errors, true),
        Some("number") => check_number(value, schema, path, errors, false),
        Some("boolean") if !value.is_boolean() => {
            errors.push(format!("{path}: expected a boolean"))
        }
        // No type: an int-or-string's validations each apply to their own JSON type, as the
        // API server applies them.
        _ => {
            if value.is_string() {
                check_string(value, schema, path, errors);
            } else if int_or_string {
                check_number(value, schema, path, errors, true);
            }
        }
    }
}

fn check_object(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(map) = value.as_object() else {
        errors.push(format!("{path}: expected an object"));
        return;
    };
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(key) = required.as_str()
            && !map.contains_key(key)
        {
            errors.push(format!("{path}: missing required field {key:?}"));
        }
    }
    if let Some(max) = schema["maxProperties"].as_u64()
        && map.len() as u64 > max
    {
        errors.push(format!("{path}: more than {max} properties"));
    }
    let preserve = schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true);
    for (key, child) in map {
        let child_path = format!("{path}.{key}");
        if let Some(property) = schema["properties"].get(key) {
            validate(child, property, &child_path, errors);
        } else if schema["additionalProperties"].is_object() {
            validate(child, &schema["additionalProperties"], &child_path, errors);
        } else if !preserve && schema["properties"].is_object() {
            errors.push(format!("{child_path}: unknown field"));
        }
    }
}

fn check_array(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(items) = value.as_array() else {
        errors.push(format!("{path}: expected an array"));
        return;
    };
    if let Some(max) = schema["maxItems"].as_u64()
        && items.len() as u64 > max
    {
        errors.push(format!("{path}: more than {max} items"));
    }
    for (index, item) in items.iter().enumerate() {
        validate(item, &schema["items"], &format!("{path}[{index}]"), errors);
    }
}

fn check_string(value: &Value, schema: &Value, path: &str, errors: &mut Vec<String>) {
    let Some(text) = value.as_str() else {
        errors.push(format!("{path}: expected a string"));
        return;
    };
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.iter().any(|a| a.as_str() == Some(text))
    {
        errors.push(format!("{path}: {text:?} is not one of {allowed:?}"));
    }
    let length = text.chars().count() as u64;
    if schema["maxLength"].as_u64().is_some_and(|max| length > max) {
        errors.push(format!("{path}: longer than maxLength"));
    }
    if schema["minLength"].as_u64().is_some_and(|min| length < min) {
        errors.push(format!("{path}: shorter than minLength"));
    }
    check_pattern(text, schema, path, errors);
}

fn check_pattern(text: &str, schema: &Value, path: &str, errors: &mut Vec<String>) {
    if let Some(pattern) = schema["pattern"].as_str() {
        let regex = regex::Regex::new(pattern).expect("CRD patterns are valid regexes");
        if !regex.is_match(text) {
            errors.push(format!("{path}: {text:?} does not match {pattern}"));
        }
    }
}

fn check_number(
    value: &Value,
    schema: &Value,
    path: &str,
    errors: &mut Vec<String>,
    integer: bool,
) {
    let Some(number) = value.as_f64() else {
        errors.push(format!("{path}: expected a number"));
        return;
    };
    if integer && !(value.is_i64() || value.is_u64()) {
        errors.push(format!("{path}: expected an integer"));
    }
    if schema["minimum"].as_f64().is_some_and(|min| number < min) {
        errors.push(format!("{path}: below the minimum"));
    }
    if schema["maximum"].as_f64().is_some_and(|max| number > max) {
        errors.push(format!("{path}: above the maximum"));
    }
}
