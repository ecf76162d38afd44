use super::*;

/// Node 20.20's constants (V8 11.3), as `v8dbg_*` symbols in its binary
/// hold them; a fixture for the layout and for `heap`'s tests.
pub(crate) fn node20_constants() -> BTreeMap<String, i64> {
    [
        ("ConsStringTag", 1),
        ("FirstNonstringType", 128),
        ("HeapObjectTag", 1),
        ("HeapObjectTagMask", 3),
        ("OneByteStringTag", 8),
        ("SeqStringTag", 0),
        ("SmiShiftSize", 31),
        ("SmiTag", 0),
        ("SmiTagMask", 1),
        ("SmiValueShift", 1),
        ("StringEncodingMask", 8),
        ("StringRepresentationMask", 7),
        ("TaggedSize", 8),
        ("ThinStringTag", 5),
        ("class_ConsString__first__String", 16),
        ("class_ConsString__second__String", 24),
        ("class_FixedArrayBase__length__SMI", 8),
        ("class_FixedArray__data__uintptr_t", 16),
        ("class_HeapObject__map__Map", 0),
        ("class_JSFunction__shared__SharedFunctionInfo", 24),
        ("class_Map__instance_type__uint16_t", 12),
        ("class_Script__line_ends__Object", 56),
        ("class_Script__name__Object", 16),
        ("class_SeqOneByteString__chars__char", 16),
        ("class_SeqTwoByteString__chars__char", 16),
        ("class_SharedFunctionInfo__name_or_scope_info__Object", 16),
        (
            "class_SharedFunctionInfo__script_or_debug_info__HeapObject",
            32,
        ),
        ("class_String__length__int32_t", 12),
        ("class_ThinString__actual__String", 16),
        ("off_fp_context", -8),
        ("off_fp_context_or_frame_type", -8),
        ("off_fp_function", -16),
        ("scopeinfo_idx_first_vars", 3),
        ("scopeinfo_idx_ncontextlocals", 2),
        ("type_FixedArray__FIXED_ARRAY_TYPE", 175),
        ("type_JSFunction__JS_FUNCTION_TYPE", 2066),
        ("type_Map__MAP_TYPE", 255),
        ("type_ScopeInfo__SCOPE_INFO_TYPE", 261),
        ("type_Script__SCRIPT_TYPE", 167),
        ("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE", 262),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

#[test]
fn node20_constants_give_its_layout() {
    let layout = V8Layout::from_constants(&node20_constants()).expect("Node 20's table");
    assert_eq!(layout.frame.function, -16);
    assert_eq!(layout.frame.context_or_marker, -8);
    assert_eq!(layout.fields.function_shared, 24);
    assert_eq!(layout.fields.shared_script, 32);
    assert_eq!(layout.fields.script_line_ends, Some(56));
    assert_eq!(layout.types.shared_function_info, 262);
    assert!(layout.is_js_function(2066) && layout.is_js_function(2080));
    assert!(!layout.is_js_function(2081) && !layout.is_js_function(2065));
    assert!(layout.is_string(40) && !layout.is_string(167));
    // Smis keep their value in the upper half; heap pointers end in 01.
    assert_eq!(layout.smi(7 << 32), Some(7));
    assert_eq!(layout.smi(0x1001), None);
    assert!(layout.is_heap_object(0x1001));
    assert_eq!(layout.untag(0x1001), 0x1000);
}

#[test]
fn fields_are_found_whatever_their_type_is_called() {
    // V8 12 spells tagged fields `Tagged_Object_`; a release may rename
    // script_or_debug_info to script.
    let mut constants = node20_constants();
    constants.remove("class_SharedFunctionInfo__name_or_scope_info__Object");
    constants.insert(
        "class_SharedFunctionInfo__name_or_scope_info__Tagged_Object_".to_owned(),
        24,
    );
    constants.remove("class_SharedFunctionInfo__script_or_debug_info__HeapObject");
    constants.insert(
        "class_SharedFunctionInfo__script__Tagged_HeapObject_".to_owned(),
        40,
    );
    constants.remove("class_Script__line_ends__Object");
    constants.remove("off_fp_context_or_frame_type");
    let layout = V8Layout::from_constants(&constants).expect("renamed fields");
    assert_eq!(layout.fields.shared_name_or_scope_info, 24);
    assert_eq!(layout.fields.shared_script, 40);
    assert_eq!(layout.fields.script_line_ends, None);
    assert_eq!(layout.frame.context_or_marker, -8);
}

#[test]
fn forged_or_missing_constants_are_refused_with_a_reason() {
    let mut missing = node20_constants();
    missing.remove("class_JSFunction__shared__SharedFunctionInfo");
    let error = V8Layout::from_constants(&missing).expect_err("missing");
    assert_eq!(error.reason(), "missing_constant");
    assert!(error.to_string().contains("JSFunction__shared"), "{error}");

    for (name, value) in [
        ("class_JSFunction__shared__SharedFunctionInfo", 1 << 40),
        ("class_Script__name__Object", -8),
        ("off_fp_function", -12),
        ("off_fp_function", 4096),
        ("type_Map__MAP_TYPE", 70_000),
        ("HeapObjectTagMask", 0),
        ("HeapObjectTag", 5),
    ] {
        let mut forged = node20_constants();
        forged.insert(name.to_owned(), value);
        let error = V8Layout::from_constants(&forged).expect_err(name);
        assert_eq!(error.reason(), "constant_out_of_range", "{name}: {error}");
    }

    let mut compressed = node20_constants();
    compressed.insert("TaggedSize".to_owned(), 4);
    assert_eq!(
        V8Layout::from_constants(&compressed).map_err(|e| e.reason()),
        Err("pointer_compression")
    );
    assert!(V8Layout::from_constants(&BTreeMap::new()).is_err());
}
