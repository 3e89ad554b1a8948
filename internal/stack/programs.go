package stack

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// BinDir returns dir, or, when it is empty, the directory of the running
// program: nodeplug-bench and nodeplug-chaos find the service binaries
// beside themselves (make build puts them all in bin/).
func BinDir(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Dir(exe), nil
}

// WriteJSON writes v to path as indented JSON, as the bench and the chaos
// program write their figures.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
