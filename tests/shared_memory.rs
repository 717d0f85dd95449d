//! Note [Shareable device memory]: device mappings are memory files that a
//! second mapping (as another process makes from the descriptor) aliases,
//! through the Rust API and the C ABI (orIpc*MemHandle).

use std::ffi::c_void;

use torch_openreg::bridge::capi::{orIpcCloseMemHandle, orIpcGetMemHandle, orIpcOpenMemHandle, OR_SUCCESS};
use torch_openreg::memory::device_memory::{self, PAGE};

#[test]
fn a_second_mapping_aliases_device_memory() {
    let len = 4 * PAGE;
    let base = device_memory::map(len).unwrap();
    let (fd, region_base, region_len) = device_memory::shared_region(base + PAGE + 8).unwrap();
    assert_eq!((region_base, region_len), (base, len));

    let alias = device_memory::map_shared(fd, len).unwrap();
    assert_ne!(alias, base);
    // SAFETY: both are live mappings of `len` bytes of the same memory file.
    unsafe {
        *((base + PAGE) as *mut u64) = 0x0123_4567_89ab_cdef;
        assert_eq!(*((alias + PAGE) as *const u64), 0x0123_4567_89ab_cdef);
        *(alias as *mut u32) = 7;
        assert_eq!(*(base as *const u32), 7);
    }
    // The alias can be shared onwards, and outlives the original.
    let (alias_fd, _, alias_len) = device_memory::shared_region(alias).unwrap();
    assert_eq!(alias_len, len);
    assert_ne!(alias_fd, fd);
    device_memory::unmap(base, len);
    // SAFETY: the alias is still mapped.
    unsafe { assert_eq!(*((alias + PAGE) as *const u64), 0x0123_4567_89ab_cdef) };
    device_memory::unmap(alias, len);
    assert!(device_memory::shared_region(alias).is_err());
}

#[test]
fn the_c_abi_exports_and_opens_device_memory() {
    let len = 2 * PAGE;
    let base = device_memory::map(len).unwrap();
    let (mut fd, mut size, mut offset) = (-1, 0usize, 0usize);
    let ptr = (base + 100) as *mut c_void;
    assert_eq!(
        orIpcGetMemHandle(&mut fd, &mut size, &mut offset, ptr),
        OR_SUCCESS
    );
    assert_eq!((size, offset), (len, 100));

    let mut opened: *mut c_void = std::ptr::null_mut();
    assert_eq!(orIpcOpenMemHandle(&mut opened, fd, size), OR_SUCCESS);
    // SAFETY: both map the same 2 pages.
    unsafe {
        *((base + 100) as *mut u8) = 42;
        assert_eq!(*(opened as *const u8).add(100), 42);
    }
    assert_eq!(orIpcCloseMemHandle(opened), OR_SUCCESS);
    assert_ne!(
        orIpcCloseMemHandle(opened),
        OR_SUCCESS,
        "closing twice is an error"
    );

    let mut heap = 0u64;
    assert_ne!(
        orIpcGetMemHandle(
            &mut fd,
            &mut size,
            &mut offset,
            (&mut heap as *mut u64).cast()
        ),
        OR_SUCCESS,
        "host memory is not device memory"
    );
    assert_ne!(
        orIpcOpenMemHandle(&mut opened, -1, PAGE),
        OR_SUCCESS,
        "a bad descriptor is an error"
    );
    device_memory::unmap(base, len);
}
