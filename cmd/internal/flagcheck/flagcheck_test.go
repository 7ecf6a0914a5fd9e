/*
Copyright 2026 The knotless Authors.

Licensed under the Apache License, Version 2.0.
*/

package flagcheck

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

func TestJoin(t *testing.T) {
	if err := Join(nil, nil); err != nil {
		t.Errorf("Join of nils: want nil, got %v", err)
	}
	if err := Join(); err != nil {
		t.Errorf("Join of nothing: want nil, got %v", err)
	}
	wrapped := fmt.Errorf("--x: %w", fs.ErrNotExist)
	err := Join(errors.New("--a is wrong"), nil, wrapped, errors.Join(errors.New("b1"), errors.New("b2")))
	if got, want := err.Error(), "--a is wrong; --x: file does not exist; b1; b2"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is does not see a joined error")
	}
}
