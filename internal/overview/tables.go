package overview

import (
	"math"

	"github.com/arbor-storage/arbor/internal/meta"
)

// TableList is the metadata tables and their balance (what `arbor table
// list --json` prints).
type TableList struct {
	Tables []meta.TableInfo `json:"tables"`
	// Balance across tables and across servers: the coefficient of
	// variation (standard deviation over mean) of inodes and of load
	// (operations per second); 0 is perfectly even.
	InodesCVTables float64 `json:"inodes_cv_tables"`
	LoadCVTables   float64 `json:"load_cv_tables"`
	InodesCVNodes  float64 `json:"inodes_cv_servers"`
	LoadCVNodes    float64 `json:"load_cv_servers"`
}

// NewTableList computes the balance of tables ts over the metadata
// servers (a server with no table counts as an empty one).
func NewTableList(ts []meta.TableInfo, servers []uint64) TableList {
	l := TableList{Tables: ts}
	if l.Tables == nil {
		l.Tables = []meta.TableInfo{}
	}
	var inodes, load []float64
	byNode := map[uint64][2]float64{}
	for _, s := range servers {
		byNode[s] = [2]float64{}
	}
	for _, t := range ts {
		inodes = append(inodes, float64(t.Inodes))
		load = append(load, t.OpsPerSec)
		v := byNode[t.Owner]
		byNode[t.Owner] = [2]float64{v[0] + float64(t.Inodes), v[1] + t.OpsPerSec}
	}
	l.InodesCVTables, l.LoadCVTables = CV(inodes), CV(load)
	var ni, nl []float64
	for node, v := range byNode {
		if node == 0 {
			continue
		}
		ni, nl = append(ni, v[0]), append(nl, v[1])
	}
	l.InodesCVNodes, l.LoadCVNodes = CV(ni), CV(nl)
	return l
}

// CV is the coefficient of variation of xs (0 for none or a zero mean).
func CV(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / float64(len(xs))
	if mean == 0 {
		return 0
	}
	var ss float64
	for _, x := range xs {
		ss += (x - mean) * (x - mean)
	}
	return math.Sqrt(ss/float64(len(xs))) / mean
}
