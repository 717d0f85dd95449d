//! Hooks: how a lower layer calls code of a higher one without naming it.
//!
//! Note [Hooks]: the layers of `src/` only call downward (Note [Layers] in
//! lib.rs). Where a lower layer has a moment a higher one must act on (the
//! runtime's one door before a launch or an event record, the allocator on
//! an allocation, logging on a warning), the lower layer owns a `Hook` at
//! that point, says in its doc comment what the hook is told and what it may
//! answer, and calls through it. The higher layer installs its function
//! once, before any device use: the crate root wires every hook when the
//! library is loaded (`wire` in lib.rs). An empty hook costs one atomic
//! load; an installed one a call, after which a diagnostic that is off
//! returns at its own switch (one more atomic load), as before it hooked in.

use std::sync::OnceLock;

/// One hook point: empty, or holding the function (or object) a higher
/// layer installed there.
pub struct Hook<T: 'static> {
    installed: OnceLock<T>,
}

impl<T: 'static> Hook<T> {
    pub const fn new() -> Hook<T> {
        Hook {
            installed: OnceLock::new(),
        }
    }

    /// Installs `value`. Each hook has one owner, wired once at load; a
    /// second install is a wiring mistake and panics (in a test), never
    /// silently replaces the first.
    pub fn install(&self, value: T) {
        if self.installed.set(value).is_err() {
            panic!("a hook was installed twice (Note [Hooks])");
        }
    }

    /// What was installed, if anything.
    #[inline]
    pub fn get(&self) -> Option<&T> {
        self.installed.get()
    }
}

impl<T: 'static> Default for Hook<T> {
    fn default() -> Hook<T> {
        Hook::new()
    }
}
