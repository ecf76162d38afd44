//! V8's object and frame layout, from the postmortem constants (`v8dbg_*`)
//! that V8's build writes into the binary that embeds it (pure).
//!
//! Each constant is looked up by its name. Field offsets are named
//! `v8dbg_class_<Class>__<field>__<type>`; the type part has changed
//! between releases (`Object`, `Tagged_Object_`), so fields are matched by
//! class and field and any type. Every value is checked against a range
//! before it is used, so a forged table costs one error, never a read far
//! from the object it describes.

use std::collections::BTreeMap;

/// Largest field offset accepted: V8's objects the agent reads are a few
/// words long.
const MAX_FIELD_OFFSET: i64 = 1024;
/// Largest frame-slot distance from the frame pointer accepted, in bytes.
const MAX_FRAME_OFFSET: i64 = 256;

/// Why a binary's postmortem constants cannot be used.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// A constant the agent needs is not exported.
    #[error("the postmortem constant {name} is missing")]
    Missing {
        /// The constant's name (without `v8dbg_`).
        name: String,
    },
    /// A constant's value is outside what any V8 has used.
    #[error("the postmortem constant {name} is {value}, outside {min}..={max}")]
    OutOfRange {
        /// The constant's name.
        name: String,
        /// Its value.
        value: i64,
        /// Smallest accepted.
        min: i64,
        /// Largest accepted.
        max: i64,
    },
    /// Pointer compression (tagged values of 4 bytes) is not supported.
    #[error("tagged values are {tagged_size} bytes (pointer compression); only 8 is supported")]
    PointerCompression {
        /// `v8dbg_TaggedSize`.
        tagged_size: i64,
    },
}

impl LayoutError {
    /// A fixed name for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            LayoutError::Missing { .. } => "missing_constant",
            LayoutError::OutOfRange { .. } => "constant_out_of_range",
            LayoutError::PointerCompression { .. } => "pointer_compression",
        }
    }
}

/// Instance types the agent checks objects against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceTypes {
    /// `JS_FUNCTION_TYPE` up to the last of its subclasses' types.
    pub js_function_first: u16,
    /// See `js_function_first`.
    pub js_function_last: u16,
    /// `SHARED_FUNCTION_INFO_TYPE`.
    pub shared_function_info: u16,
    /// `SCRIPT_TYPE`.
    pub script: u16,
    /// `SCOPE_INFO_TYPE`.
    pub scope_info: u16,
    /// `FIXED_ARRAY_TYPE`.
    pub fixed_array: u16,
    /// `MAP_TYPE`.
    pub map: u16,
    /// Types below this are strings.
    pub first_nonstring: u16,
}

/// How strings are laid out and told apart by instance type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StringLayout {
    /// Instance-type bits giving the representation.
    pub representation_mask: u16,
    /// Representation of sequential strings.
    pub sequential: u16,
    /// Representation of cons strings.
    pub cons: u16,
    /// Representation of thin strings (forwarding to an internalized one).
    pub thin: u16,
    /// Instance-type bits giving the encoding.
    pub encoding_mask: u16,
    /// Encoding of one-byte strings (the other is two-byte).
    pub one_byte: u16,
    /// `String::length` (an `int32`).
    pub length: u32,
    /// First character of a sequential one-byte string.
    pub one_byte_chars: u32,
    /// First character of a sequential two-byte string.
    pub two_byte_chars: u32,
    /// `ConsString::first`.
    pub cons_first: u32,
    /// `ConsString::second`.
    pub cons_second: u32,
    /// `ThinString::actual`.
    pub thin_actual: u32,
}

/// Where a JavaScript frame keeps its function and context, relative to
/// its frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// The `JSFunction`.
    pub function: i32,
    /// The context, or in typed (non-JavaScript) frames a Smi marker.
    pub context_or_marker: i32,
}

/// Field offsets (from an object's untagged address) the agent reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    /// `HeapObject::map`.
    pub map: u32,
    /// `Map::instance_type` (a `uint16`).
    pub map_instance_type: u32,
    /// `JSFunction::shared`.
    pub function_shared: u32,
    /// `SharedFunctionInfo::name_or_scope_info`.
    pub shared_name_or_scope_info: u32,
    /// `SharedFunctionInfo::script_or_debug_info`.
    pub shared_script: u32,
    /// `Script::name`.
    pub script_name: u32,
    /// `Script::source`.
    pub script_source: u32,
    /// `Script::line_ends`, when exported.
    pub script_line_ends: Option<u32>,
    /// `FixedArrayBase::length` (a Smi).
    pub fixed_array_length: u32,
    /// `FixedArray`'s first element.
    pub fixed_array_data: u32,
    /// ScopeInfo slot of the first variable name.
    pub scope_info_first_vars: u32,
    /// ScopeInfo slot of the number of context locals.
    pub scope_info_context_locals: u32,
}

/// Everything the agent needs to name a V8 process's JavaScript frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct V8Layout {
    /// Mask of a tagged value's tag bits.
    pub heap_object_tag_mask: u64,
    /// Tag of heap object pointers.
    pub heap_object_tag: u64,
    /// Mask of a Smi's tag bits.
    pub smi_tag_mask: u64,
    /// Tag of Smis.
    pub smi_tag: u64,
    /// Shift of a Smi's value.
    pub smi_shift: u32,
    /// Frame slots.
    pub frame: FrameLayout,
    /// Instance types.
    pub types: InstanceTypes,
    /// Strings.
    pub strings: StringLayout,
    /// Fields.
    pub fields: Fields,
    /// Optimized code's tables (for inlined functions); `None` when the
    /// binary's constants do not describe them (before V8 12, or stripped),
    /// and then frames are named without their inlined functions.
    pub code: Option<CodeLayout>,
}

/// Instance types of the arrays V8 has used for one purpose over releases
/// (its trusted, protected and plain variants); 0 where not exported.
pub type ArrayTypes = [u16; 3];

/// Where optimized code keeps its source positions and inlined functions:
/// the `Code` object (apart from its instructions since V8 12, which live
/// in an `InstructionStream` just before them) and its deoptimization data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    /// `CODE_TYPE`.
    pub code_type: u16,
    /// `INSTRUCTION_STREAM_TYPE`.
    pub instruction_stream_type: u16,
    /// `Code::instruction_stream`.
    pub instruction_stream: u32,
    /// `Code::instruction_start` (an address).
    pub instruction_start: u32,
    /// `Code::instruction_size` (an `int`).
    pub instruction_size: u32,
    /// `Code::flags` (a `uint32`), which hold the code kind.
    pub flags: u32,
    /// Mask of the code kind in the flags.
    pub kind_mask: u32,
    /// Shift of the code kind in the flags.
    pub kind_shift: u32,
    /// The baseline (Sparkplug) kind; the optimizing tiers' kinds follow it.
    pub baseline_kind: u32,
    /// `Code::deoptimization_data`.
    pub deoptimization_data: u32,
    /// `Code::source_position_table`.
    pub source_positions: u32,
    /// Types the source position table and inlining positions may have.
    pub byte_array_types: ArrayTypes,
    /// Types the deoptimization data may have.
    pub fixed_array_types: ArrayTypes,
    /// Types the deoptimization literals may have.
    pub literal_array_types: ArrayTypes,
    /// Deoptimization data index of the inlined functions' count.
    pub inlined_count_index: u32,
    /// Deoptimization data index of the literals.
    pub literals_index: u32,
    /// Deoptimization data index of the inlining positions.
    pub inlining_positions_index: u32,
    /// Where the deoptimization data names the optimized function, to check
    /// that the code is the frame's function's.
    pub optimized_function: Option<OptimizedFunction>,
}

/// How deoptimization data names the function it was compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizedFunction {
    /// The `SharedFunctionInfo` at this index (before V8 12).
    Shared {
        /// Deoptimization data index.
        index: u32,
    },
    /// A `SharedFunctionInfoWrapper` at this index, holding it at `offset`.
    Wrapped {
        /// Deoptimization data index.
        index: u32,
        /// `SHARED_FUNCTION_INFO_WRAPPER_TYPE`.
        wrapper_type: u16,
        /// `SharedFunctionInfoWrapper::shared_info`.
        offset: u32,
    },
}

/// How many instance types follow `JS_FUNCTION_TYPE` for its subclasses
/// (class and builtin constructors) when the binary does not export the
/// range: V8 9.6 to 13 have 15 in all, and the shared-function-info check
/// that follows keeps anything else in this window from being named.
const JS_FUNCTION_TYPES_WHEN_UNEXPORTED: u16 = 15;

impl V8Layout {
    /// The layout from `constants` (names without the `v8dbg_` prefix, and
    /// their values).
    pub fn from_constants(constants: &BTreeMap<String, i64>) -> Result<V8Layout, LayoutError> {
        let c = Constants(constants);
        let tagged_size = c.value("TaggedSize", 4, 8)?;
        if tagged_size != 8 {
            return Err(LayoutError::PointerCompression { tagged_size });
        }
        let heap_object_tag_mask = c.value("HeapObjectTagMask", 1, 7)? as u64;
        let heap_object_tag = c.value("HeapObjectTag", 1, 7)? as u64;
        let smi_tag_mask = c.value("SmiTagMask", 1, 7)? as u64;
        let smi_tag = c.value_or("SmiTag", 0, 0, 7)? as u64;
        if heap_object_tag & !heap_object_tag_mask != 0 || smi_tag & !smi_tag_mask != 0 {
            return Err(LayoutError::OutOfRange {
                name: "HeapObjectTag".to_owned(),
                value: heap_object_tag as i64,
                min: 0,
                max: heap_object_tag_mask as i64,
            });
        }
        // A Smi's value sits above its tag and the shift bits.
        let smi_shift = (c.value("SmiShiftSize", 0, 62)? + c.value_or("SmiValueShift", 1, 1, 1)?)
            .clamp(1, 63) as u32;
        let frame = FrameLayout {
            function: c.frame_offset("off_fp_function")?,
            context_or_marker: match c.frame_offset("off_fp_context_or_frame_type") {
                Ok(offset) => offset,
                Err(LayoutError::Missing { .. }) => c.frame_offset("off_fp_context")?,
                Err(error) => return Err(error),
            },
        };
        let js_function = c.instance_type("JSFunction")?;
        let types = InstanceTypes {
            js_function_first: c.value_or("FirstJSFunctionType", js_function.into(), 1, 0xffff)?
                as u16,
            js_function_last: c.value_or(
                "LastJSFunctionType",
                i64::from(js_function) + i64::from(JS_FUNCTION_TYPES_WHEN_UNEXPORTED) - 1,
                1,
                0xffff,
            )? as u16,
            shared_function_info: c.instance_type("SharedFunctionInfo")?,
            script: c.instance_type("Script")?,
            scope_info: c.instance_type("ScopeInfo")?,
            fixed_array: c.instance_type("FixedArray")?,
            map: c.instance_type("Map")?,
            first_nonstring: c.value("FirstNonstringType", 1, 0xffff)? as u16,
        };
        let strings = StringLayout {
            representation_mask: c.value("StringRepresentationMask", 1, 0xff)? as u16,
            sequential: c.value_or("SeqStringTag", 0, 0, 0xff)? as u16,
            cons: c.value("ConsStringTag", 0, 0xff)? as u16,
            thin: c.value("ThinStringTag", 0, 0xff)? as u16,
            encoding_mask: c.value("StringEncodingMask", 1, 0xff)? as u16,
            one_byte: c.value("OneByteStringTag", 0, 0xff)? as u16,
            length: c.field("String", "length")?,
            one_byte_chars: c.field("SeqOneByteString", "chars")?,
            two_byte_chars: c.field("SeqTwoByteString", "chars")?,
            cons_first: c.field("ConsString", "first")?,
            cons_second: c.field("ConsString", "second")?,
            thin_actual: c.field("ThinString", "actual")?,
        };
        let fields = Fields {
            // The map is the first field: a zero-valued constant is left out
            // of the binary's data by some compilers.
            map: c.field_or("HeapObject", "map", 0)?,
            map_instance_type: c.field("Map", "instance_type")?,
            function_shared: c.field("JSFunction", "shared")?,
            shared_name_or_scope_info: c.field("SharedFunctionInfo", "name_or_scope_info")?,
            shared_script: match c.field("SharedFunctionInfo", "script_or_debug_info") {
                Ok(offset) => offset,
                Err(LayoutError::Missing { .. }) => c.field("SharedFunctionInfo", "script")?,
                Err(error) => return Err(error),
            },
            script_name: c.field("Script", "name")?,
            // V8 13 stopped exporting it; it has always been the field
            // before the name.
            script_source: match c.field("Script", "source") {
                Ok(offset) => offset,
                Err(LayoutError::Missing { .. }) => c
                    .field("Script", "name")?
                    .checked_sub(8)
                    .ok_or_else(|| LayoutError::OutOfRange {
                        name: "class_Script__name".to_owned(),
                        value: 0,
                        min: 8,
                        max: MAX_FIELD_OFFSET,
                    })?,
                Err(error) => return Err(error),
            },
            script_line_ends: match c.field("Script", "line_ends") {
                Ok(offset) => Some(offset),
                Err(LayoutError::Missing { .. }) => None,
                Err(error) => return Err(error),
            },
            fixed_array_length: c.field("FixedArrayBase", "length")?,
            fixed_array_data: c.field("FixedArray", "data")?,
            scope_info_first_vars: c.value("scopeinfo_idx_first_vars", 0, 64)? as u32,
            scope_info_context_locals: c.value("scopeinfo_idx_ncontextlocals", 0, 64)? as u32,
        };
        let code = CodeLayout::from_constants(&c)
            .inspect_err(|error| tracing::debug!(%error, "optimized code's tables not described"))
            .ok();
        Ok(V8Layout {
            heap_object_tag_mask,
            heap_object_tag,
            smi_tag_mask,
            smi_tag,
            smi_shift,
            frame,
            types,
            strings,
            fields,
            code,
        })
    }

    /// Whether a tagged value is a heap object pointer.
    pub fn is_heap_object(&self, value: u64) -> bool {
        value & self.heap_object_tag_mask == self.heap_object_tag
    }

    /// The untagged address of a heap object pointer.
    pub fn untag(&self, value: u64) -> u64 {
        value & !self.heap_object_tag_mask
    }

    /// The value of a Smi; `None` for anything else.
    pub fn smi(&self, value: u64) -> Option<i64> {
        (value & self.smi_tag_mask == self.smi_tag).then(|| (value as i64) >> self.smi_shift)
    }

    /// Whether `instance_type` is a string's.
    pub fn is_string(&self, instance_type: u16) -> bool {
        instance_type < self.types.first_nonstring
    }

    /// Whether `instance_type` is a `JSFunction`'s (or a subclass's).
    pub fn is_js_function(&self, instance_type: u16) -> bool {
        (self.types.js_function_first..=self.types.js_function_last).contains(&instance_type)
    }
}

impl CodeLayout {
    fn from_constants(c: &Constants<'_>) -> Result<CodeLayout, LayoutError> {
        let wrapper = c.field("Code", "wrapper");
        // V8 13 stopped exporting the two tables' offsets; they have been
        // the two fields before the wrapper since it came in (V8 12), and
        // what they point to is checked by type before it is read.
        let before_wrapper = |slots: u32| match &wrapper {
            Ok(offset) => offset
                .checked_sub(8 * slots)
                .ok_or(LayoutError::OutOfRange {
                    name: "class_Code__wrapper".to_owned(),
                    value: i64::from(*offset),
                    min: 16,
                    max: MAX_FIELD_OFFSET,
                }),
            Err(error) => Err(error.clone()),
        };
        let either = |first: &str, second: &str, slots: u32| match c.field("Code", first) {
            Err(LayoutError::Missing { .. }) => match c.field("Code", second) {
                Err(LayoutError::Missing { .. }) => before_wrapper(slots),
                other => other,
            },
            other => other,
        };
        let types = |names: [&str; 3]| -> ArrayTypes {
            names.map(|name| c.instance_type(name).unwrap_or(0))
        };
        let index = |name: &str| c.value(name, 0, 64).map(|v| v as u32);
        let optimized_function = match index("DeoptimizationDataWrappedSharedFunctionInfoIndex") {
            Ok(index) => match (
                c.instance_type("SharedFunctionInfoWrapper"),
                c.field("SharedFunctionInfoWrapper", "shared_info"),
            ) {
                (Ok(wrapper_type), Ok(offset)) => Some(OptimizedFunction::Wrapped {
                    index,
                    wrapper_type,
                    offset,
                }),
                _ => None,
            },
            Err(_) => index("DeoptimizationDataSharedFunctionInfoIndex")
                .ok()
                .map(|index| OptimizedFunction::Shared { index }),
        };
        Ok(CodeLayout {
            code_type: c.instance_type("Code")?,
            instruction_stream_type: c.instance_type("InstructionStream")?,
            instruction_stream: c.field("Code", "instruction_stream")?,
            instruction_start: c.field("Code", "instruction_start")?,
            instruction_size: c.field("Code", "instruction_size")?,
            flags: c.field("Code", "flags")?,
            kind_mask: c.value("CodeKindFieldMask", 1, 0xffff)? as u32,
            kind_shift: c.value_or("CodeKindFieldShift", 0, 0, 31)? as u32,
            baseline_kind: c.value("CodeKindBaseline", 1, 63)? as u32,
            deoptimization_data: either(
                "deoptimization_data",
                "deoptimization_data_or_interpreter_data",
                2,
            )?,
            source_positions: either("source_position_table", "position_table", 1)?,
            byte_array_types: types(["TrustedByteArray", "ByteArray", "ByteArray"]),
            fixed_array_types: types(["ProtectedFixedArray", "TrustedFixedArray", "FixedArray"]),
            literal_array_types: types(["TrustedWeakFixedArray", "WeakFixedArray", "FixedArray"]),
            inlined_count_index: index("DeoptimizationDataInlinedFunctionCountIndex")?,
            literals_index: index("DeoptimizationDataLiteralArrayIndex")?,
            inlining_positions_index: index("DeoptimizationDataInliningPositionsIndex")?,
            optimized_function,
        })
    }
}

/// Lookups in the constants, each checked against a range.
struct Constants<'a>(&'a BTreeMap<String, i64>);

impl Constants<'_> {
    fn value(&self, name: &str, min: i64, max: i64) -> Result<i64, LayoutError> {
        let value = *self.0.get(name).ok_or_else(|| LayoutError::Missing {
            name: name.to_owned(),
        })?;
        check(name, value, min, max)
    }

    /// A constant that is zero in every V8 may be absent: the compiler
    /// puts zero-valued data in `.bss`, which some strip tools drop.
    fn value_or(&self, name: &str, default: i64, min: i64, max: i64) -> Result<i64, LayoutError> {
        match self.0.get(name) {
            Some(&value) => check(name, value, min, max),
            None => Ok(default),
        }
    }

    fn frame_offset(&self, name: &str) -> Result<i32, LayoutError> {
        let value = self.value(name, -MAX_FRAME_OFFSET, MAX_FRAME_OFFSET)?;
        if value % 8 != 0 || value == 0 {
            return Err(LayoutError::OutOfRange {
                name: name.to_owned(),
                value,
                min: -MAX_FRAME_OFFSET,
                max: MAX_FRAME_OFFSET,
            });
        }
        Ok(value as i32)
    }

    fn instance_type(&self, class: &str) -> Result<u16, LayoutError> {
        let prefix = format!("type_{class}__");
        let (name, &value) = self
            .0
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
            .next()
            .ok_or(LayoutError::Missing { name: prefix })?;
        Ok(check(name, value, 1, 0xffff)? as u16)
    }

    fn field(&self, class: &str, field: &str) -> Result<u32, LayoutError> {
        let prefix = format!("class_{class}__{field}__");
        let (name, &value) = self
            .0
            .range(prefix.clone()..)
            .take_while(|(name, _)| name.starts_with(&prefix))
            .next()
            .ok_or(LayoutError::Missing { name: prefix })?;
        Ok(check(name, value, 0, MAX_FIELD_OFFSET)? as u32)
    }

    fn field_or(&self, class: &str, field: &str, default: u32) -> Result<u32, LayoutError> {
        match self.field(class, field) {
            Err(LayoutError::Missing { .. }) => Ok(default),
            other => other,
        }
    }
}

fn check(name: &str, value: i64, min: i64, max: i64) -> Result<i64, LayoutError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(LayoutError::OutOfRange {
            name: name.to_owned(),
            value,
            min,
            max,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
