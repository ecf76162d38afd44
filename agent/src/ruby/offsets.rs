//! The layout of Ruby's VM structures, per version, for x86-64: a table of
//! the agent's own, checked against each version's `vm_core.h`, `iseq.h`
//! and `include/ruby/internal/core/{rstring,rarray}.h`, and against a live
//! Debian `ruby3.1` (`tests/privileged/ruby_frames.rs`). A version missing
//! here is refused, never guessed.

use crate::abi::RubyProcess;

/// Offsets of one Ruby version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RubyOffsets {
    /// (major, minor) this row describes.
    pub version: (u8, u8),
    /// `rb_execution_context_t.vm_stack`, `.vm_stack_size`, `.cfp`.
    pub ec_vm_stack: u16,
    /// See `ec_vm_stack`.
    pub ec_vm_stack_size: u16,
    /// See `ec_vm_stack`.
    pub ec_cfp: u16,
    /// `sizeof(rb_control_frame_t)` and its `pc`, `iseq`, `ep` fields.
    pub cfp_size: u16,
    /// See `cfp_size`.
    pub cfp_pc: u16,
    /// See `cfp_size`.
    pub cfp_iseq: u16,
    /// See `cfp_size`.
    pub cfp_ep: u16,
    /// `VM_FRAME_FLAG_FINISH` and `VM_FRAME_FLAG_CFRAME` in `ep[0]`.
    pub flag_finish: u32,
    /// See `flag_finish`.
    pub flag_cframe: u32,
    /// `rb_iseq_t.body`.
    pub iseq_body: u16,
    /// `rb_iseq_constant_body.iseq_size` (u32) and `.iseq_encoded`.
    pub body_iseq_size: u16,
    /// See `body_iseq_size`.
    pub body_iseq_encoded: u16,
    /// `.location.pathobj` (a String, or an Array `[path, realpath]`).
    pub body_pathobj: u16,
    /// `.location.label`.
    pub body_label: u16,
    /// `.location.first_lineno` (a Fixnum).
    pub body_first_lineno: u16,
    /// `.insns_info.body`, `.positions`, `.size` (u32), `.succ_index_table`.
    pub insns_body: u16,
    /// See `insns_body`.
    pub insns_positions: u16,
    /// See `insns_body`.
    pub insns_size: u16,
    /// See `insns_body`.
    pub insns_succ_table: u16,
    /// `sizeof(struct iseq_insn_info_entry)`; `line_no` is its first int.
    pub insn_info_size: u16,
}

/// Ruby 3.1: `rb_control_frame_t` is pc, sp, iseq, self, ep, block_code,
/// `__bp__`, jit_return (8 words); the insn info entry is line_no, node_id,
/// events (USE_ISEQ_NODE_ID is on).
const RUBY_3_1: RubyOffsets = RubyOffsets {
    version: (3, 1),
    ec_vm_stack: 0,
    ec_vm_stack_size: 8,
    ec_cfp: 16,
    cfp_size: 64,
    cfp_pc: 0,
    cfp_iseq: 16,
    cfp_ep: 32,
    flag_finish: 0x0020,
    flag_cframe: 0x0080,
    iseq_body: 16,
    body_iseq_size: 4,
    body_iseq_encoded: 8,
    body_pathobj: 64,
    body_label: 80,
    body_first_lineno: 88,
    insns_body: 120,
    insns_positions: 128,
    insns_size: 136,
    insns_succ_table: 144,
    insn_info_size: 12,
};

/// The offsets of Ruby `major.minor`, if the agent knows them.
pub fn for_version(major: u8, minor: u8) -> Option<&'static RubyOffsets> {
    [&RUBY_3_1]
        .into_iter()
        .find(|row| row.version == (major, minor))
}

/// glibc's x86-64 TCB header keeps the DTV pointer in its second word; each
/// DTV entry is a (block, to_free) pair.
const GLIBC_TCB_DTV: u16 = 8;
const GLIBC_DTV_ENTRY_SIZE: u16 = 16;
/// `ep[VM_ENV_DATA_INDEX_ME_CREF]`, two words below ep.
const EP_METHOD_ENTRY: u16 = 16;

impl RubyOffsets {
    /// The BPF map entry for a process whose libruby has TLS module id
    /// `tls_module` and keeps `ruby_current_ec` at `tls_offset` in its block.
    pub fn kernel_entry(&self, tls_module: u64, tls_offset: u64) -> RubyProcess {
        RubyProcess {
            tls_module,
            tls_offset,
            tcb_dtv: GLIBC_TCB_DTV,
            dtv_entry_size: GLIBC_DTV_ENTRY_SIZE,
            ec_vm_stack: self.ec_vm_stack,
            ec_vm_stack_size: self.ec_vm_stack_size,
            ec_cfp: self.ec_cfp,
            cfp_size: self.cfp_size,
            cfp_pc: self.cfp_pc,
            cfp_iseq: self.cfp_iseq,
            cfp_ep: self.cfp_ep,
            ep_method_entry: EP_METHOD_ENTRY,
            frame_flag_finish: self.flag_finish,
            frame_flag_cframe: self.flag_cframe,
            reserved: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_known_versions_have_offsets() {
        assert!(for_version(3, 1).is_some());
        assert!(for_version(3, 2).is_none());
        assert!(for_version(2, 7).is_none());
        let entry = RUBY_3_1.kernel_entry(1, 8);
        assert_eq!(
            (entry.tls_module, entry.tls_offset, entry.cfp_size),
            (1, 8, 64)
        );
    }
}
