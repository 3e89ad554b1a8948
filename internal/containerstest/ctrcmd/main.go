// Command ctrcmd is the program in the image of the tests that run
// containers (containerstest builds it and imports it as an image).
// It prints its arguments, then does what each argument says, in order:
//
//	env         print env=<the environment, a JSON array>
//	cwd         print cwd=<the working directory>
//	out=TEXT    print TEXT to stdout
//	err=TEXT    print TEXT to stderr
//	cat=PATH    print cat PATH=<the file's content, or error: ...>
//	write=PATH  create the file; print write PATH=ok, or error: ...
//	stat=PATH   print stat PATH=<the file's type, or error: ...>
//	long=N      print a line of N x's to stdout
//	sleep       print sleeping, wait for SIGTERM, print got SIGTERM
//	exit=N      exit with N once done (0 by default)
//
// Other arguments are only printed.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
)

func main() {
	// At once, so that a SIGTERM after "sleeping" is printed is caught.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	fmt.Println("args=" + jsonOf(os.Args))
	code := 0
	for _, arg := range os.Args[1:] {
		verb, val, _ := strings.Cut(arg, "=")
		switch verb {
		case "env":
			fmt.Println("env=" + jsonOf(os.Environ()))
		case "cwd":
			wd, err := os.Getwd()
			fmt.Println("cwd=" + orError(wd, err))
		case "out":
			fmt.Println(val)
		case "err":
			fmt.Fprintln(os.Stderr, val)
		case "cat":
			b, err := os.ReadFile(val)
			fmt.Printf("cat %s=%s\n", val, orError(string(b), err))
		case "write":
			err := os.WriteFile(val, []byte("written\n"), 0o644)
			fmt.Printf("write %s=%s\n", val, orError("ok", err))
		case "stat":
			fmt.Printf("stat %s=%s\n", val, fileType(val))
		case "long":
			n, _ := strconv.Atoi(val)
			fmt.Println(strings.Repeat("x", n))
		case "sleep":
			fmt.Println("sleeping")
			<-term
			fmt.Println("got SIGTERM")
		case "exit":
			code, _ = strconv.Atoi(val)
		}
	}
	os.Exit(code)
}

func jsonOf(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

func orError(s string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

func fileType(path string) string {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "error: " + err.Error()
	case fi.Mode()&os.ModeCharDevice != 0:
		return "char device"
	case fi.Mode()&os.ModeDevice != 0:
		return "block device"
	case fi.IsDir():
		return "directory"
	}
	return "file"
}
