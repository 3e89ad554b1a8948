package resourceapi

import "syscall"

// noFollow makes opening the store's file fail on a symbolic link.
const noFollow = syscall.O_NOFOLLOW
