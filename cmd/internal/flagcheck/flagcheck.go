/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

// Package flagcheck holds the checks that the commands' options share.
// Every error names its flag and none repeats a credential: URLs are shown
// without their user information.
package flagcheck

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
)

// Join returns nil when every error is nil, else one error that holds
// them all. Its message is one line (the problems joined with "; "): a
// command that cannot start prints exactly one line.
func Join(errs ...error) error {
	var out list
	for _, err := range errs {
		if err != nil {
			out = append(out, err)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

type list []error

func (l list) Error() string {
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	return strings.Join(msgs, "; ")
}

// Unwrap lets errors.Is and errors.As see every problem.
func (l list) Unwrap() []error { return l }

// Kubeconfig requires a kubeconfig path (the flag's default is
// $KUBECONFIG).
func Kubeconfig(path string) error {
	if strings.TrimSpace(path) == "" {
		return errors.New("no kubeconfig: pass --kubeconfig or set KUBECONFIG")
	}
	return nil
}

// Workspace requires a valid kcp workspace path such as root:knotless.
func Workspace(flag, path string) error {
	if !logicalcluster.NewPath(path).IsValid() {
		return fmt.Errorf("%s %q is not a valid workspace path", flag, path)
	}
	return nil
}

// Positive requires a duration above zero.
func Positive(flag string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be positive, got %s", flag, d)
	}
	return nil
}

// HostPort requires host:port with a numeric port (the host may be empty,
// which listens on every address; port 0 picks a free port).
func HostPort(flag, addr string) error {
	if !isHostPort(addr) {
		return fmt.Errorf("%s %q must be host:port", flag, addr)
	}
	return nil
}

// BindAddress requires host:port, or "0", which disables the endpoint.
func BindAddress(flag, addr string) error {
	if addr != "0" && !isHostPort(addr) {
		return fmt.Errorf("%s %q must be host:port, or 0 to disable it", flag, addr)
	}
	return nil
}

func isHostPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

// URL parses raw, the value of flag, and refuses user information in it.
// Its errors never repeat raw, which may hold a password; once it
// returned a URL, the URL's String holds no credential.
func URL(flag, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("%s is not a URL: %w", flag, err)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%s must not carry credentials (user information in the URL)", flag)
	}
	return u, nil
}
