// Package apicheck holds the test that keeps the module's public Go API and
// its list in api/listenhub.txt in step: an exported identifier that appears
// or disappears fails it until the list says so.
package apicheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const (
	module = "github.com/listenhub/listenhub"
	root   = "../.."
	list   = "api/listenhub.txt"
)

// TestPublicAPI compares the exported identifiers of every importable
// package of the module (not internal/, not commands, not other modules)
// with the list in api/listenhub.txt. Set
// LISTENHUB_API_PRINT=1 to print the current list.
func TestPublicAPI(t *testing.T) {
	got := exported(t)
	if os.Getenv("LISTENHUB_API_PRINT") != "" {
		fmt.Println(strings.Join(got, "\n"))
	}
	want := listed(t)
	var added, removed []string
	for _, id := range got {
		if _, ok := slices.BinarySearch(want, id); !ok {
			added = append(added, id)
		}
	}
	for _, id := range want {
		if _, ok := slices.BinarySearch(got, id); !ok {
			removed = append(removed, id)
		}
	}
	if len(added) > 0 || len(removed) > 0 {
		t.Errorf("the public API differs from the list in %s (a promise to users: change the list only on purpose)\nexported, not listed:\n\t%s\nlisted, not exported:\n\t%s",
			list, strings.Join(added, "\n\t"), strings.Join(removed, "\n\t"))
	}
}

// listed reads the list: one identifier a line, blank lines and # comments
// ignored.
func listed(t *testing.T) []string {
	f, err := os.Open(filepath.Join(root, list))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") {
			ids = append(ids, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// exported lists every exported identifier: package-level names as
// pkg.Name, methods as pkg.Type.Method(), struct fields and interface
// methods as pkg.Type.Field.
func exported(t *testing.T) []string {
	var ids []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		name := d.Name()
		if rel != "." {
			if name == "internal" || name == "testdata" || name == "cmd" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "node_modules" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		ids = append(ids, pkgAPI(t, path, filepath.ToSlash(rel))...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ids)
	// Files for other platforms are read too (a name each backend
	// defines is listed once).
	return slices.Compact(ids)
}

func pkgAPI(t *testing.T, dir, rel string) []string {
	fset := token.NewFileSet()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Name.Name == "main" {
			return nil
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil
	}
	p, err := doc.NewFromFiles(fset, files, module+"/"+rel)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	add := func(s string) { ids = append(ids, p.Name+"."+s) }
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, n := range v.Names {
				if ast.IsExported(n) {
					add(n)
				}
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	for _, f := range p.Funcs {
		add(f.Name + "()")
	}
	for _, ty := range p.Types {
		add(ty.Name)
		values(ty.Consts)
		values(ty.Vars)
		for _, f := range ty.Funcs {
			add(f.Name + "()")
		}
		for _, m := range ty.Methods {
			add(ty.Name + "." + m.Name + "()")
		}
		for _, spec := range ty.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok || ts.Name.Name != ty.Name {
				continue
			}
			var fields *ast.FieldList
			switch x := ts.Type.(type) {
			case *ast.SelectorExpr:
				// An alias of an internal type: its fields and methods
				// are this package's promise too.
				if ts.Assign.IsValid() {
					ids = append(ids, aliased(t, files, x, p.Name+"."+ty.Name)...)
				}
			case *ast.StructType:
				fields = x.Fields
			case *ast.InterfaceType:
				fields = x.Methods
			}
			if fields == nil {
				continue
			}
			for _, fl := range fields.List {
				names := fl.Names
				if len(names) == 0 { // embedded
					if id := embeddedName(fl.Type); id != nil {
						names = []*ast.Ident{id}
					}
				}
				for _, n := range names {
					if ast.IsExported(n.Name) {
						add(ty.Name + "." + n.Name)
					}
				}
			}
		}
	}
	return ids
}

// aliased lists the fields and methods of the internal type sel names,
// under the alias name as.
func aliased(t *testing.T, files []*ast.File, sel *ast.SelectorExpr, as string) []string {
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return nil
	}
	for _, f := range files {
		for _, im := range f.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			name := path[strings.LastIndex(path, "/")+1:]
			if im.Name != nil {
				name = im.Name.Name
			}
			rel, ok := strings.CutPrefix(path, module+"/")
			if name != pkg.Name || !ok || !strings.HasPrefix(rel, "internal/") {
				continue
			}
			var ids []string
			prefix := name + "." + sel.Sel.Name + "."
			for _, id := range pkgAPI(t, filepath.Join(root, rel), rel) {
				if m, ok := strings.CutPrefix(id, prefix); ok {
					ids = append(ids, as+"."+m)
				}
			}
			return ids
		}
	}
	return nil
}

func embeddedName(e ast.Expr) *ast.Ident {
	switch x := e.(type) {
	case *ast.Ident:
		return x
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel
	case *ast.IndexExpr:
		return embeddedName(x.X)
	}
	return nil
}
