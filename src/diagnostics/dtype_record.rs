//! Under `OPENREG_DTYPES=record`, the (op, dtype, dtype computed in) of
//! each kernel call (Note [Dtype policy] in cpp/ops/dtype_policy.h), kept until
//! read: what scripts/generate_dtype_table.py derives the dtype table from.

use std::collections::BTreeSet;
use std::ffi::{c_char, CString};
use std::sync::Mutex;

static RECORDED: Mutex<BTreeSet<(String, String, String)>> = Mutex::new(BTreeSet::new());
static TAKEN: Mutex<Option<CString>> = Mutex::new(None);

/// Notes one kernel call: `computed` differs from `dtype` when the call ran
/// in a wider dtype.
pub fn record(op: &str, dtype: &str, computed: &str) {
    let mut recorded = RECORDED.lock().unwrap_or_else(|e| e.into_inner());
    recorded.insert((op.to_owned(), dtype.to_owned(), computed.to_owned()));
}

/// The calls recorded since the last take, one `op<TAB>dtype<TAB>computed`
/// line each, sorted.
pub fn take() -> String {
    let recorded = std::mem::take(&mut *RECORDED.lock().unwrap_or_else(|e| e.into_inner()));
    recorded
        .into_iter()
        .map(|(op, dtype, computed)| format!("{op}\t{dtype}\t{computed}\n"))
        .collect()
}

/// `take()` for the Python bindings: the text lives until the next call.
#[no_mangle]
pub extern "C" fn orTakeRecordedKernelDtypes() -> *const c_char {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    let text = CString::new(take()).unwrap_or_default();
    taken.insert(text).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_returns_each_call_once_and_clears() {
        record("aten::histc", "Int", "Double");
        record("aten::histc", "Int", "Double");
        record("aten::mm.out", "Long", "Long");
        assert_eq!(
            take(),
            "aten::histc\tInt\tDouble\naten::mm.out\tLong\tLong\n"
        );
        assert_eq!(take(), "");
    }
}
