package app

import (
	"flag"
	"path/filepath"
)

// absPath is a flag.Value holding a path that is made absolute when it is
// set. A relative --root-dir (or NODEPLUG_ROOT_DIR) then means the
// directory below the working directory at start, as a user means it: the
// sockets derived from it are absolute paths, which a dialler never takes
// for a TCP address, and which do not move if the process changes
// directory.
type absPath struct{ p *string }

// AbsPathVar defines a path flag on fs whose value is made absolute when
// set; value, the default, is kept as it is (give an absolute one).
func AbsPathVar(fs *flag.FlagSet, p *string, name, value, usage string) {
	*p = value
	fs.Var(absPath{p}, name, usage)
}

func (a absPath) String() string {
	if a.p == nil {
		return ""
	}
	return *a.p
}

func (a absPath) Set(v string) error {
	if v == "" {
		*a.p = ""
		return nil
	}
	abs, err := filepath.Abs(v)
	if err != nil {
		return err
	}
	*a.p = abs
	return nil
}
